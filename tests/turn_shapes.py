"""The model and exact engine shared by the multi-turn tests (tests/envs/test_multiturn.py,
tests/envs/test_user_env.py, tests/agents/test_agent_engine.py): one set of shapes, so the three
files compile the engine's functions once between them in a worker."""

from minirl.inference.engine import EngineConfig
from minirl.modeling.model import ModelConfig
from minirl.modeling.tokenizer import CharTokenizer

TOK = CharTokenizer()
CFG = ModelConfig(
    vocab_size=TOK.vocab_size,
    dim=64,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    mlp_dim=128,
    max_seq_len=128,
)
DIGITS = tuple((int(TOK.encode(c, bos=False)[0]),) for c in "0123456789")
EXACT = EngineConfig(
    slots=4,
    cache_len=128,
    prefill_buckets=(32,),
    prefill_rows=2,
    decode_chunk=4,
    top_k=40,
    top_p=0.95,
    stop_sequences=DIGITS,  # a digit ends a turn: short turns from a random model
    eos_ids=(TOK.eos_id,),
    exact=True,
)
