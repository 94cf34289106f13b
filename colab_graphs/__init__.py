"""colab-graphs: measure and train language models for what they add to a team of models.

The curated public API. Heavy packages (LiteLLM, torch, transformers, TRL, matplotlib) load only inside the
functions that use them, so importing this package stays quick.

    >>> import colab_graphs as cg
    >>> report = cg.run_audit("majority_vote", "pool.yaml", "gsm8k", limit=50, method="exact")  # doctest: +SKIP
    >>> report = cg.run_audit(my_langgraph_app, "pool.yaml", "gsm8k", limit=50)  # doctest: +SKIP
"""

# Process defaults before anything imports litellm or transformers (see _env): a library user's first call
# must not block on litellm's price-table download where there is no network.
import colab_graphs._env  # noqa: F401
import colab_graphs._moved  # noqa: F401  (old import paths of moved modules, for one release)
from colab_graphs.aggregators import get_aggregator, get_router
from colab_graphs.api import (
    Progress,
    RunResult,
    arun,
    arun_audit,
    arun_study,
    as_examples,
    as_pool,
    atrain,
    member_chat_model,
    run,
    run_audit,
    run_study,
    train,
    use_pool,
)
from colab_graphs.builder import GraphBuilder
from colab_graphs.coalition import restrict
from colab_graphs.compile import RunContext, compile_graph
from colab_graphs.langchain.binding import MemberAbsent
from colab_graphs.models.cache import CallCache
from colab_graphs.models.client import CallError, ModelClient
from colab_graphs.otel import TracingUnavailable, disable_tracing, enable_tracing, flush_tracing
from colab_graphs.pool import Member, Pool, PoolError
from colab_graphs.protocol_registry import build_protocol, get_protocol, list_protocols
from colab_graphs.registry import aggregator, protocol, router
from colab_graphs.runner import run_dataset
from colab_graphs.spec import END, START, Aggregate, GraphSpec, LogitSeat, Seat, SpecError
from colab_graphs.tasks.example import DatasetError, Example
from colab_graphs.tasks.loaders import load_examples
from colab_graphs.tasks.scoring import get_scorer, get_task, register_scorer, register_task, task_for
from colab_graphs.tasks.task_types import Score, TaskType, TaskView
from colab_graphs.trace import Call, Trace

__version__ = "0.1.0"

__all__ = [
    "END",
    "START",
    "Aggregate",
    "Call",
    "CallCache",
    "CallError",
    "DatasetError",
    "Example",
    "GraphBuilder",
    "GraphSpec",
    "LogitSeat",
    "Member",
    "MemberAbsent",
    "ModelClient",
    "Pool",
    "PoolError",
    "Progress",
    "RunContext",
    "RunResult",
    "Score",
    "Seat",
    "SpecError",
    "TaskType",
    "TaskView",
    "Trace",
    "TracingUnavailable",
    "__version__",
    "aggregator",
    "arun",
    "arun_audit",
    "arun_study",
    "as_examples",
    "as_pool",
    "atrain",
    "build_protocol",
    "compile_graph",
    "disable_tracing",
    "enable_tracing",
    "flush_tracing",
    "get_aggregator",
    "get_protocol",
    "get_router",
    "get_scorer",
    "get_task",
    "list_protocols",
    "load_examples",
    "member_chat_model",
    "protocol",
    "register_scorer",
    "register_task",
    "restrict",
    "router",
    "run",
    "run_audit",
    "run_dataset",
    "run_study",
    "task_for",
    "train",
    "use_pool",
]
