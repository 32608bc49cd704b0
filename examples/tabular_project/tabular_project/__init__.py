"""An example distlab project: its own datasets, models and task, plugged in by config.

Nothing is imported here: the config's `imports:` list names the modules that register
their builders (`tabular_project.data`, `tabular_project.models`, `tabular_project.tasks`).
"""
