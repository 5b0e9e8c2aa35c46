"""Whole pipelines: every component with a plan sharded (`parallelize_pipeline`) or loaded shard-on-load
(`load_pipeline`) by the one engine."""

from .load import check_pipeline_files, load_pipeline, transformer_class
from .parallelize import WHOLE, ComponentReport, PipelineReport, parallelize_pipeline, prepare_component

__all__ = [
    "WHOLE",
    "check_pipeline_files",
    "ComponentReport",
    "PipelineReport",
    "load_pipeline",
    "parallelize_pipeline",
    "prepare_component",
    "transformer_class",
]
