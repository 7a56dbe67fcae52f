"""`model_from_env()`: the chat model the environment asks for — a provider's when its key is set, else the
offline model. It lives with the providers because it imports them; `waypoint.engine.models.model_from_env` names
it."""

from __future__ import annotations

import os
from typing import Any

from waypoint.engine.errors import ModelError
from waypoint.engine.models import ChatModel, offline

__all__ = ["model_from_env"]


def model_from_env(**options: Any) -> ChatModel:
    """The model the environment asks for; `options` go to its constructor.

    `WAYPOINT_MODEL_PROVIDER` (`openai`, `anthropic` or `offline`) chooses when set. Otherwise:
    `OpenAIChatModel` when `OPENAI_API_KEY` is set (model `OPENAI_MODEL`, default gpt-4o-mini; server
    `OPENAI_BASE_URL`); else `AnthropicChatModel` when `ANTHROPIC_API_KEY` is set (model `ANTHROPIC_MODEL`,
    default claude-haiku-4-5; server `ANTHROPIC_BASE_URL`); else `OfflineModel()`.
    """
    chosen = os.environ.get("WAYPOINT_MODEL_PROVIDER", "").strip().lower()
    if chosen not in ("", "openai", "anthropic", "offline"):
        raise ModelError(f"WAYPOINT_MODEL_PROVIDER={chosen!r} names no provider Waypoint has; use openai, "
                         "anthropic or offline (or unset it to choose by which API key is set)")
    if chosen == "offline" or (not chosen and not os.environ.get("OPENAI_API_KEY")
                               and not os.environ.get("ANTHROPIC_API_KEY")):
        return offline.OfflineModel(word_delay=_pace())  # looked up now: a test may patch it
    if chosen == "anthropic" or (not chosen and not os.environ.get("OPENAI_API_KEY")):
        from .anthropic_chat import AnthropicChatModel

        return AnthropicChatModel(model=os.environ.get("ANTHROPIC_MODEL", "claude-haiku-4-5"),
                                  base_url=os.environ.get("ANTHROPIC_BASE_URL"),
                                  api_key=os.environ.get("ANTHROPIC_API_KEY"), **options)
    from .openai_chat import OpenAIChatModel

    return OpenAIChatModel(model=os.environ.get("OPENAI_MODEL", "gpt-4o-mini"),
                           base_url=os.environ.get("OPENAI_BASE_URL"), api_key=os.environ.get("OPENAI_API_KEY"),
                           **options)


def _pace() -> float:
    """`WAYPOINT_OFFLINE_PACE`: seconds between the offline model's streamed words (unset: no pause)."""
    text = os.environ.get("WAYPOINT_OFFLINE_PACE", "").strip()
    try:
        pace = float(text) if text else 0.0
    except ValueError:
        pace = -1.0
    if not 0 <= pace <= 5:
        raise ModelError(f"WAYPOINT_OFFLINE_PACE={text!r} must be seconds between streamed words, from 0 to 5")
    return pace
