"""How a workflow's prompt becomes a model's token ids, per agent: one workflow drives models
with and without a chat template (an instruct model beside a base model) unchanged.

    chat messages ─► prompt_format "chat"  ─► the tokenizer's chat template
                                               (add_generation_prompt; special tokens as the
                                               template writes them)
                  ─► prompt_format "plain" ─► the plain rendering (below), encoded the way the
                                               tokenizer encodes text (its BOS where it adds one:
                                               Gemma's), and PLAIN_STOP added to the call's stops
    "auto" (AgentSpec.prompt_format's default): "chat" where the tokenizer has a chat template,
    "plain" where it has none (a base model such as "gemma3-270m")
    a str prompt ─► one user message;  token ids ─► as they are (no format applied)

The plain rendering is the question/answer transcript base models continue best (measured on
Gemma 3 270M base, bench/README.md "mixed"): the system messages first, then each user turn as
"Question: ..." and each assistant turn as "Answer: ...", ending with "Answer:" for the model to
complete:

    You are good at arithmetic.

    Question: What is 3 + 4? Reply with only the number.
    Answer:

A base model then goes on with the next "Question:", so a call in this format stops at
PLAIN_STOP (the engines cut the text there).
"""
from __future__ import annotations

from typing import Any

PROMPT_FORMATS = ("auto", "chat", "plain")
"""AgentSpec.prompt_format's values."""
PLAIN_STOP = "\nQuestion:"
"""Where a completion of the plain rendering ends: the model starting the next question."""
_LABELS = {"user": "Question", "assistant": "Answer"}


def has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def resolve_format(prompt_format: str, tokenizer: Any, agent: str) -> str:
    """"chat" or "plain" for an agent with this tokenizer; ValueError naming the fix where
    "chat" is asked of a tokenizer without a template."""
    if prompt_format not in PROMPT_FORMATS:
        raise ValueError(f"agent {agent}: AgentSpec.prompt_format must be one of "
                         f"{PROMPT_FORMATS}, got {prompt_format!r}")
    if prompt_format == "auto":
        return "chat" if has_chat_template(tokenizer) else "plain"
    if prompt_format == "chat" and not has_chat_template(tokenizer):
        raise ValueError(f"agent {agent}: AgentSpec.prompt_format = 'chat' but the model's "
                         "tokenizer has no chat template (a base model); use 'plain' or "
                         "'auto' (the plain question/answer rendering), or give a model "
                         "directory whose tokenizer has one")
    return prompt_format


def _text(content: Any, agent: str) -> str:
    """A message's content as text: a str, or OpenAI's list of text parts (joined by newlines,
    as the gateway joins them)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return "\n".join(p["text"] for p in content)
    raise ValueError(f"agent {agent}: a message's content must be a str or a list of "
                     f"{{'type': 'text', 'text': ...}} parts, got {content!r:.80}")


def render_plain(messages: list[dict], agent: str = "?") -> str:
    """The plain rendering of chat messages (the module docstring shows it). System (and
    OpenAI's developer) messages are plain paragraphs where they stand; user turns are
    "Question:", assistant turns "Answer:", any other role ("tool") is labelled by its name;
    empty messages are left out. A last assistant message is a finished answer, not a prefix
    to continue: the rendering always ends with a fresh "Answer:"."""
    parts = []
    for m in messages:
        role = m.get("role") if isinstance(m, dict) else None
        if not isinstance(role, str) or not role:
            raise ValueError(f"agent {agent}: every chat message needs a 'role', got {m!r:.80}")
        text = _text(m.get("content"), agent).strip()
        if not text:
            continue
        if role in ("system", "developer"):
            parts.append(f"{text}\n\n")
        elif role == "assistant":
            parts.append(f"Answer: {text}\n\n")
        else:
            parts.append(f"{_LABELS.get(role, role.capitalize())}: {text}\n")
    parts.append("Answer:")
    return "".join(parts)


def encode_chat(tokenizer: Any, messages: list[dict], prompt_format: str,
                agent: str = "?") -> list[int]:
    """Token ids of chat `messages` in `prompt_format` ("chat" or "plain", resolved)."""
    if prompt_format == "chat":
        text = tokenizer.apply_chat_template(messages, tokenize=False,
                                             add_generation_prompt=True)
        return tokenizer.encode(text, add_special_tokens=False)
    text = render_plain(messages, agent)
    ids = tokenizer.encode(text, add_special_tokens=True)  # the BOS where the tokenizer adds one
    eos = getattr(tokenizer, "eos_token_id", None)
    if eos is not None and len(ids) > 1 and ids[-1] == eos:
        ids = ids[:-1]  # ... but never an EOS after the prompt: the model is to go on from it
    return ids
