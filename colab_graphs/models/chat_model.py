"""A LangChain chat model over LiteLLM, for dropping any pool member into a LangChain / LangGraph agent app.

The model takes the same settings as a pool member (``model`` plus any ``litellm.completion`` keyword
argument), so one class covers zoo models in process (``local/smollm2-135m``), a served policy
(``openai/NAME`` with ``api_base``) and hosted APIs.

Example:
    >>> from colab_graphs.models.chat_model import LiteLLMChatModel
    >>> llm = LiteLLMChatModel(model="local/smollm2-135m", settings={"temperature": 0, "max_tokens": 64})
    >>> llm.invoke("What is 2+2?").content  # doctest: +SKIP
    'The answer to this classic math problem is 4.'

Tool calling is not supported: the model answers with text only.
"""

from __future__ import annotations

from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic import Field

import colab_graphs._env  # noqa: F401  (offline settings before litellm loads)

_ROLES = {"human": "user", "ai": "assistant", "system": "system", "tool": "tool", "chat": "user"}


def _to_openai(message: BaseMessage) -> dict[str, Any]:
    role = getattr(message, "role", None) if message.type == "chat" else _ROLES.get(message.type)
    if role is None:
        raise ValueError(f"cannot send a LangChain message of type {message.type!r} to a chat model")
    content = message.content if isinstance(message.content, str) else message.text
    return {"role": role, "content": content}


class LiteLLMChatModel(BaseChatModel):
    """LangChain ``BaseChatModel`` that calls ``litellm.completion`` / ``litellm.acompletion``.

    Attributes:
        model: LiteLLM model string (``local/...``, ``openai/...``, ``hosted_vllm/...``, ...).
        settings: Other ``litellm.completion`` keyword arguments (``api_base``, ``temperature``, ...).
    """

    model: str
    settings: dict[str, Any] = Field(default_factory=dict)

    @classmethod
    def from_settings(cls, settings: dict[str, Any]) -> LiteLLMChatModel:
        """Build from a pool member's settings mapping (``model`` plus litellm keyword arguments)."""
        if "model" not in settings:
            raise ValueError(f"member settings need a 'model' key, got keys {sorted(settings)}")
        rest = {k: v for k, v in settings.items() if k != "model"}
        return cls(model=settings["model"], settings=rest)

    @property
    def _llm_type(self) -> str:
        return "colab-graphs-litellm"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        from colab_graphs.redaction import public_settings

        # LangChain writes these to its tracers (LangSmith, callbacks): no key, header or URL secret.
        return {"model": self.model, **public_settings(self.settings, {})}

    def _kwargs(self, messages: list[BaseMessage], stop: list[str] | None, **kwargs: Any) -> dict[str, Any]:
        if self.model.startswith("local/"):
            from colab_graphs.models.local import register_local_provider

            register_local_provider()
        call = {**self.settings, **kwargs, "model": self.model, "messages": [_to_openai(m) for m in messages]}
        if stop:
            call["stop"] = stop
        return call

    @staticmethod
    def _result(response: Any) -> ChatResult:
        choice = response.choices[0]
        usage = getattr(response, "usage", None)
        metadata: dict[str, Any] = {"finish_reason": choice.finish_reason, "model_name": response.model}
        message = AIMessage(content=choice.message.content or "", response_metadata=metadata)
        if usage is not None:
            message.usage_metadata = {
                "input_tokens": usage.prompt_tokens,
                "output_tokens": usage.completion_tokens,
                "total_tokens": usage.total_tokens,
            }
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        import litellm

        return self._result(litellm.completion(**self._kwargs(messages, stop, **kwargs)))

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        import litellm

        return self._result(await litellm.acompletion(**self._kwargs(messages, stop, **kwargs)))
