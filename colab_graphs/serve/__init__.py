"""`colab-graphs serve`: an OpenAI-compatible HTTP server over in-process models (and the scripted test server's
HTTP core, `http`).

`server` runs it, `http` is the HTTP layer (routing, errors, streaming), `openai_api` checks request bodies,
`serve_replies` turns engine results into OpenAI replies, `tool_calls` parses tool calls out of completions.

Contract: it stands above local inference (`colab_graphs.local`) and the plain core modules; it never imports the
call path (`colab_graphs.models`), the LangChain adapters, or anything above the core.
"""
