"""The LangChain adapters: pool members as LangChain chat models over the call path.

`chat_model` (`LiteLLMChatModel`, a `BaseChatModel`), `member_chat` (the chat model a user's LangGraph app asks
for a member: `member_chat_model`), `lc` (LangChain messages to and from the call path's), `binding` (which
member a node's model is bound to in a coalition, and what an absent member does).

Contract: it stands above the call path (`colab_graphs.models`) and the plain core modules; it never imports
local inference or the server directly, nor anything above the core (the compiler and the public API import it).
"""
