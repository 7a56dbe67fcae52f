"""What a graph is made of: node specs and kinds (`spec`, `nodes`), state fields and their reducers
(`reducers`) and types (`state_schema`), field mappings (`field_mapping`), retry policies (`retry`), streams of
chunks (`streams`), and the compiled shape the run loop walks (`graph_shape`: `GraphShape`, `CNode`). Builders above put these together;
the run loop above reads them."""

from .field_mapping import FieldMapping, FlowPlan, assemble, from_field, map_fields, path_of, show_path, to_field
from .graph_shape import CBranch, CNode, GraphShape
from .nodes import Component, Lambda, NodeRunnable, as_runnable
from .reducers import Reducers, StateJournal, Update, add_messages, append, apply_writes, reducers_of
from .retry import RetryPolicy
from .spec import END, KEY_RE, START, Branch, Durability, NodeSpec, Trigger
from .state_schema import StateChange, state_changes, state_schema, validate_field
from .streams import Chunks, register_concat, registered_for, to_chunks, to_value

__all__ = [
    "Branch", "CBranch", "CNode", "Chunks", "Component", "Durability", "END", "FieldMapping", "FlowPlan",
    "GraphShape", "KEY_RE", "Lambda", "NodeRunnable", "NodeSpec", "Reducers", "RetryPolicy", "START", "StateChange",
    "StateJournal",
    "Trigger", "Update", "add_messages", "append", "apply_writes", "as_runnable", "assemble", "from_field",
    "map_fields", "path_of", "reducers_of", "register_concat", "registered_for", "show_path", "to_chunks", "to_field",
    "to_value", "state_changes", "state_schema", "validate_field"
]
