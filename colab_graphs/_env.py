"""Offline settings that must be in force before litellm, transformers or huggingface_hub are imported.

Without them `import litellm` fetches the model cost map from the network and huggingface_hub sends
telemetry; on a machine with no internet both block for seconds. Users who set these themselves win.
"""

import os

_OFFLINE_DEFAULTS = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "LITELLM_OFFLINE_MODE": "true",
    "HF_HUB_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "TRL_EXPERIMENTAL_SILENCE": "1",
}


def apply_offline_defaults() -> None:
    for key, value in _OFFLINE_DEFAULTS.items():
        os.environ.setdefault(key, value)


apply_offline_defaults()
