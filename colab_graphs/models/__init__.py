"""Model access: the one call path (client, cache), the in-process local provider, the zoo, the server.

Submodules import their heavy dependencies (litellm, torch, transformers) lazily.
"""
