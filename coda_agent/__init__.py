"""The CODA agent (arXiv 2508.20096): a Qwen2.5-VL planner (Cerebrum) that writes the next step in words and
a fixed UI-TARS-1.5 executor (Cerebellum) that turns it into a GUI action; baselines; the `coda eval` runner.

Modules: models (VLM access), planner, executor, uitars (UI-TARS grammar), policy (agents), rollout (episodes
over a vector env, training samples), eval (runner), train (the training methods), tiny (tiny checkpoints for
tests). Importing this package does not import torch; loading a model does.
"""

from .models import Generation, ModelError, OpenAIVLM, SamplingParams, TransformersVLM, load_model, smart_resize

__all__ = ["Generation", "ModelError", "OpenAIVLM", "SamplingParams", "TransformersVLM", "load_model", "smart_resize"]
