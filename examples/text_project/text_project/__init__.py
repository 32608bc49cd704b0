"""An example distlab project: text classification on raw strings.

Nothing is imported here: the config's `imports:` list names the modules that register
their builders (`text_project.data`, `text_project.models`).
"""
