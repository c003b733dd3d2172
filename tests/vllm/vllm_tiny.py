"""Constants shared by the vLLM tests and their conftest (a plain module: importing a conftest is fragile)."""

MAX_MODEL_LEN = 512
EOS_PROMPT = [11, 22, 33, 44, 55, 66, 77]
