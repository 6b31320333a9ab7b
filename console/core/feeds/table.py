"""The feeds' one table: what a box session runs (the state keeps those its front end takes:
console/core/state.py). Adding a feed is its module and its line here."""

from __future__ import annotations

from samai.console.core.disk.feed import DiskFeed
from samai.console.core.evals.feed import EvalsFeed
from samai.console.core.feeds import Feed
from samai.console.core.feeds.environments import EnvironmentsFeed
from samai.console.core.feeds.memory import MemoryFeed
from samai.console.core.feeds.nodes import NodesFeed
from samai.console.core.feeds.watchers import WatchersFeed
from samai.console.core.gpus.feed import GpusFeed
from samai.console.core.serving.feed import ServingFeed
from samai.console.core.training.feed import TrainingFeed


def feed_classes() -> tuple[type[Feed], ...]:
    """Every feed, in the order the state folds them."""
    return (TrainingFeed, ServingFeed, GpusFeed, MemoryFeed, DiskFeed, EnvironmentsFeed, EvalsFeed, WatchersFeed,
            NodesFeed)
