"""Deprecated alias (distlab 0.2's documented path of `FIELDS`): results.json's fields are
`distlab.records.FIELDS` (`distlab.records.fields`); the ranking rule is
`distlab.records.ranking`, the config's figure checks `distlab.config.figures`."""

from distlab.deprecated import warn_moved

warn_moved(__name__)

from distlab.config.figures import (  # noqa: E402
    WATCHED,
    check_figure,
    check_objective,
    check_task_metrics,
    check_watched,
    needs_validation,
    refuse_test_split,
)
from distlab.launch.objective import task_metrics  # noqa: E402
from distlab.records.fields import (  # noqa: E402
    BY_NAME,
    COMPLETED,
    FIELDS,
    OBJECTIVES,
    TRAINED,
    WRITTEN_BY,
    Field,
    is_field,
)
from distlab.records.metrics import (  # noqa: E402
    BUILTIN_METRICS,
    BUILTIN_TASKS,
    builtin_task_metrics,
    top_k_name,
)
from distlab.records.ranking import (  # noqa: E402
    SPLIT_PREFIXES,
    best_metric,
    direction,
    maximizes,
    metric_direction,
    objective_field,
    objective_fields,
)
from distlab.records.results import (  # noqa: E402
    failed_results,
    finite,
    objective_value,
    with_objective_value,
)

__all__ = ["BUILTIN_METRICS", "BUILTIN_TASKS", "BY_NAME", "COMPLETED", "FIELDS", "Field",
           "OBJECTIVES", "SPLIT_PREFIXES", "TRAINED", "WATCHED", "WRITTEN_BY", "best_metric",
           "builtin_task_metrics", "check_figure", "check_objective", "check_task_metrics",
           "check_watched", "direction", "failed_results", "finite", "is_field", "maximizes",
           "metric_direction", "needs_validation", "objective_field", "objective_fields",
           "objective_value", "refuse_test_split", "task_metrics", "top_k_name",
           "with_objective_value"]
