"""What sits above the core: everything that builds a run from a config and the parts a run
plugs in. A run end to end (runner.py, run_dir.py, inputs.py, warmstart.py, tracking.py); the
built-in tasks and dataset files (tasks/), the verifiers (verifiers/), multi-turn environments
and their tools (envs/); Hugging Face checkpoints, tokenizers and chat templates (hf.py,
hf_tokenizer.py, chat_template.py); the commands (cli.py, export.py, plan.py, mismatch/,
plots/) and the simulator (sim/). The core never imports from here; these import the core
through its interfaces (`minirl.data.Task`, `minirl.verifier.Verifier`, the `Engine`)."""
