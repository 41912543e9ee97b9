"""The tasks, one package each: what differs between detection, segmentation and classification.

Each package defines its :class:`yolotrain.task.Task` as ``TASK``; :func:`yolotrain.task.get_task`
finds it by name. A package may use evaluation, export, data, models and losses, never the engine.
"""
