"""The call path: every model call a run, audit, study or training makes goes through `client.ModelClient`.

Cache (`cache`, keyed on the request and the identity of the model that answers: `identity`) -> single flight
(`flight`) -> concurrency limit -> the direct lane (`direct`) or LiteLLM, on a loop of their own (`loops`) ->
usage, cost (`pricing`) and spending caps (`spend`).

Contract: it imports the plain core modules below it (`pool`, `trace`, `redaction`, `watch`, `files`, `_env`)
and knows in-process inference only as a LiteLLM provider, through `colab_graphs.local.provider` (registering
the provider, the exact token ids of its replies, the identity of the weights it would load, its token count);
never the server (`colab_graphs.serve`), the LangChain adapters (`colab_graphs.langchain`), or anything above
the core. Submodules import their heavy dependencies (litellm) lazily.

The modules that lived here before 0.1's split (the local provider and its engine, the server, the LangChain
adapters) keep their old import paths for one release, with a `MovedModuleWarning` (`colab_graphs._moved`).
"""
