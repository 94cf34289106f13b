"""In-process inference: `local/...` models, their weights and the batching engine that runs them.

`provider` is the LiteLLM custom provider (`local/...` model names) and the call path's one door into this
package; `local_engine` batches generation, `engines` holds the loaded engines (and models served from memory),
`zoo` fetches and converts the small models it knows (`chat_templates/`), `merge` merges weights, `logits`,
`guided` and `json_guide` decode at the logit level, `sampling` checks sampling settings, `weights` says what
weights a reference loads.

Contract: it imports only the plain core modules below it (`_env`, `files`) and its own modules; never the call
path (`colab_graphs.models`), the server, the LangChain adapters or anything above the core. torch and
transformers load lazily, inside the functions that use them.
"""
