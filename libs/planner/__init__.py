"""Capacity planner: adapter sizes, memory per tier, load times, GPUs and cost, all from tensor shapes."""

from libs.planner.inputs import PlanInputs, load_base
from libs.planner.plan import Plan, gpus_needed, make_plan, make_variants

__all__ = ["Plan", "PlanInputs", "gpus_needed", "load_base", "make_plan", "make_variants"]
