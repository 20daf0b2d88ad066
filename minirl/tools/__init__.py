"""What sits above the core: the `minirl` command line (cli.py), `minirl diagnose` (mismatch/:
|Δlogp| per training-inference mismatch source) and the figures (plots/). The core never imports
from here; these import the core."""
