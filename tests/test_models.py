"""Built-in models and tasks: tokenizer, sizes, save/load, determinism, warm start, cache."""
from __future__ import annotations

import json
import os
import string

import pytest
import torch
from safetensors.torch import load_file

from flexmarl import models
from flexmarl.models import (SIZES, build_model_dir, build_tokenizer, chat_example, chat_prompt,
                             ensure_model, load_model, load_tokenizer, warm_start)
from flexmarl.tasks import Task, addition_tasks, exact_match

ASCII_TEXT = string.printable.replace("\t", "").replace("\r", "").replace("\x0b", "") \
    .replace("\x0c", "") + "\n  two  spaces . ,\n\n"


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Train on one thread: on a 2-core machine shared with other torch processes, OpenMP
    threads waiting for each other made a 40-step tiny warm start 15x slower (28 s vs 2 s)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_model_dir("tiny", tmp_path_factory.mktemp("models") / "tiny")


# --- tasks -----------------------------------------------------------------------------------

def test_addition_tasks_are_deterministic_and_correct():
    tasks = addition_tasks(50, seed=3)
    assert tasks == addition_tasks(50, seed=3)
    assert tasks != addition_tasks(50, seed=4)
    assert len({t.task_id for t in tasks}) == 50
    for t in tasks:
        a, b = t.prompt.removeprefix("Compute ").removesuffix(".").split("+")
        assert 10 <= int(a) <= 99 and 10 <= int(b) <= 99
        assert t.answer == str(int(a) + int(b))
        assert set(t.prompt + t.answer) <= set(string.printable)
    assert all(len(t.prompt) == len("Compute 1+2.") for t in addition_tasks(20, digits=1))


@pytest.mark.parametrize("kwargs", [dict(n=-1), dict(n=2.0), dict(n=1, digits=0),
                                    dict(n=1, digits=10), dict(n=1, seed="0")])
def test_addition_tasks_reject_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        addition_tasks(**kwargs)


@pytest.mark.parametrize("text, reward", [
    ("82", 1.0), (" 82<|im_end|>", 1.0), ("The answer is 82.", 1.0), ("82 or 81", 1.0),
    ("81 or 82", 0.0), ("820", 0.0), ("082", 0.0), ("-82", 0.0), ("8 2", 0.0), ("", 0.0),
    ("\x00\xff\ufffd garbage", 0.0), ("٨٢", 0.0), ("x" * 100_000 + "82", 1.0),
])
def test_exact_match(text, reward):
    assert exact_match(text, Task(prompt="Compute 37+45.", answer="82", task_id="t")) == reward


def test_exact_match_rejects_non_strings():
    with pytest.raises(TypeError, match="decode"):
        exact_match(None, Task(prompt="p", answer="1", task_id="t"))


# --- tokenizer -------------------------------------------------------------------------------

def test_tokenizer_round_trips_one_token_per_ascii_character(tiny_dir):
    for tokenizer in (build_tokenizer(), load_tokenizer(tiny_dir)):
        ids = tokenizer.encode(ASCII_TEXT, add_special_tokens=False)
        assert len(ids) == len(ASCII_TEXT)
        assert ids == [ord(c) for c in ASCII_TEXT]
        assert tokenizer.decode(ids) == ASCII_TEXT
        assert tokenizer.decode(tokenizer.encode("é ☃ x", add_special_tokens=False)) == "é ☃ x"


def test_chat_template_and_special_tokens(tiny_dir):
    tokenizer = load_tokenizer(tiny_dir)
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Compute 1+2."}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == ("<|im_start|>system\nBe brief.<|im_end|>\n"
                    "<|im_start|>user\nCompute 1+2.<|im_end|>\n<|im_start|>assistant\n")
    assert tokenizer.apply_chat_template(messages[1:], tokenize=False) == \
        "<|im_start|>user\nCompute 1+2.<|im_end|>\n"
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    ids = chat_prompt(tokenizer, "Compute 1+2.")
    assert tokenizer.decode(ids) == text[len("<|im_start|>system\nBe brief.<|im_end|>\n"):]
    assert ids.count(tokenizer.convert_tokens_to_ids("<|im_start|>")) == 2
    generation = json.loads((tiny_dir / "generation_config.json").read_text())
    assert tokenizer.eos_token_id in generation["eos_token_id"]
    assert json.loads((tiny_dir / "config.json").read_text())["eos_token_id"] == \
        tokenizer.eos_token_id


def test_chat_example_labels_only_the_answer_and_eos():
    tokenizer = build_tokenizer()
    ids, labels = chat_example(tokenizer, Task(prompt="Compute 1+2.", answer="3", task_id="t"))
    assert tokenizer.decode(ids).endswith("<|im_start|>assistant\n3<|im_end|>")
    assert [x for x in labels if x != -100] == [ord("3"), tokenizer.eos_token_id]
    assert labels[-2:] == ids[-2:]


# --- building and loading --------------------------------------------------------------------

@pytest.mark.parametrize("size", sorted(SIZES))
def test_every_size_builds_and_survives_save_load(size, tmp_path):
    model_dir = build_model_dir(size, tmp_path / size)
    config = json.loads((model_dir / "config.json").read_text())
    spec = SIZES[size]
    assert config["vocab_size"] % 64 == 0 and config["vocab_size"] >= len(build_tokenizer())
    assert config["tie_word_embeddings"] and config["max_position_embeddings"] == 512
    assert config["hidden_size"] // config["num_attention_heads"] in (32, 64)
    assert (config["num_hidden_layers"], config["hidden_size"]) == (spec.num_layers,
                                                                    spec.hidden_size)
    model = load_model(model_dir)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert sum(p.numel() for p in model.parameters()) == models.num_parameters(size)
    ids = torch.tensor([chat_prompt(load_tokenizer(model_dir), "Compute 12+34.")])
    with torch.no_grad():
        before = model(ids).logits
    model.save_pretrained(tmp_path / "again")
    with torch.no_grad():
        after = load_model(tmp_path / "again")(ids).logits
    assert torch.equal(before, after)


def test_build_is_deterministic_by_seed(tmp_path):
    rng_state = torch.random.get_rng_state()
    a = load_file(build_model_dir("tiny", tmp_path / "a", seed=7) / "model.safetensors")
    b = load_file(build_model_dir("tiny", tmp_path / "b", seed=7) / "model.safetensors")
    c = load_file(build_model_dir("tiny", tmp_path / "c", seed=8) / "model.safetensors")
    assert a.keys() == b.keys() == c.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)
    assert torch.equal(torch.random.get_rng_state(), rng_state)


def test_build_rejects_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="medium.*small.*tiny"):
        build_model_dir("huge", tmp_path / "x")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "file").write_text("x")
    with pytest.raises(ValueError, match="empty directory"):
        build_model_dir("tiny", tmp_path / "full")
    with pytest.raises(ValueError, match="not a model directory"):
        load_model(tmp_path / "full")
    with pytest.raises(ValueError, match="head_dim"):
        models.ModelSize(name="odd", hidden_size=96, num_layers=1, num_heads=2, num_kv_heads=1,
                         intermediate_size=64)


# --- warm start ------------------------------------------------------------------------------

def test_warm_start_lowers_the_loss(tmp_path):
    model_dir = build_model_dir("tiny", tmp_path / "tiny")
    tokenizer = load_tokenizer(model_dir)
    examples = [chat_example(tokenizer, t) for t in addition_tasks(32, seed=99)]
    ids = torch.tensor([i for i, _ in examples if len(i) == len(examples[0][0])])
    labels = torch.tensor([lab for i, lab in examples if len(i) == len(examples[0][0])])

    def loss() -> float:
        with torch.no_grad():
            return load_model(model_dir)(input_ids=ids, labels=labels).loss.item()

    before = loss()
    metrics = warm_start(model_dir, steps=40, batch_size=16, lr=3e-3, seed=0)
    assert set(metrics) == {"final_loss", "accuracy", "seconds", "steps"}
    assert 0.0 <= metrics["accuracy"] <= 1.0 and metrics["steps"] == 40
    assert loss() < before - 1.0  # about 5.8 (uniform over 320) to under 2 in 40 steps


@pytest.mark.parametrize("kwargs", [dict(steps=0), dict(batch_size=0), dict(lr=0.0),
                                    dict(lr=2.0), dict(tasks=[])])
def test_warm_start_rejects_bad_arguments(tiny_dir, kwargs):
    with pytest.raises(ValueError):
        warm_start(tiny_dir, **{**dict(steps=1, batch_size=1, lr=1e-3, seed=0), **kwargs})


# --- cache -----------------------------------------------------------------------------------

@pytest.fixture
def count_builds(monkeypatch):
    calls = []
    real = models.build_model_dir

    def counting(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(models, "build_model_dir", counting)
    return calls


def test_ensure_model_builds_once_then_reuses(tmp_path, count_builds):
    first = ensure_model("tiny", warm_start_steps=2, cache_dir=tmp_path)
    mtime = (first / "model.safetensors").stat().st_mtime_ns
    assert ensure_model("tiny", warm_start_steps=2, cache_dir=tmp_path) == first
    assert len(count_builds) == 1
    assert (first / "model.safetensors").stat().st_mtime_ns == mtime
    assert json.loads((first / models.WARM_START_FILE).read_text())["steps"] == 2
    assert load_model(first) is not None and load_tokenizer(first) is not None
    assert ensure_model("tiny", warm_start_steps=2, cache_dir=tmp_path, seed=1) != first
    assert ensure_model("tiny", warm_start_steps=0, cache_dir=tmp_path) != first
    assert len(count_builds) == 3
    assert all(not p.name.startswith(".") for p in tmp_path.iterdir())  # no temp dirs left


def test_ensure_model_cache_root_from_env_then_argument(tmp_path, monkeypatch, count_builds):
    monkeypatch.setenv("FLEXMARL_CACHE", str(tmp_path / "env"))
    from_env = ensure_model("tiny", warm_start_steps=0)
    assert from_env.parent == tmp_path / "env"
    from_arg = ensure_model("tiny", warm_start_steps=0, cache_dir=tmp_path / "arg")
    assert from_arg.parent == tmp_path / "arg" and from_arg.name == from_env.name


def test_ensure_model_loser_of_a_race_uses_the_winner(tmp_path, monkeypatch):
    real = models.build_model_dir

    def build_while_another_process_finishes(size, out_dir, *, seed=0):
        path = real(size, out_dir, seed=seed)
        # The "other process" renames its finished directory into place first.
        winner = tmp_path / out_dir.name.split(".")[1]
        real(size, winner, seed=seed)
        (winner / "winner").write_text("")
        return path

    monkeypatch.setattr(models, "build_model_dir", build_while_another_process_finishes)
    path = ensure_model("tiny", warm_start_steps=0, cache_dir=tmp_path)
    assert (path / "winner").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]


@pytest.mark.parametrize("kwargs", [dict(size="huge"), dict(warm_start_steps=-1),
                                    dict(warm_start_steps=1.5), dict(seed=None)])
def test_ensure_model_rejects_bad_arguments(tmp_path, kwargs):
    with pytest.raises(ValueError):
        ensure_model(**{"size": "tiny", **kwargs}, cache_dir=tmp_path)
    assert not os.listdir(tmp_path)


def test_ensure_model_removes_leftovers_of_dead_builds_only(tmp_path):
    name = ensure_model("tiny", warm_start_steps=0, cache_dir=tmp_path / "probe").name
    dead = tmp_path / (models._build_prefix(name).replace(f".{os.getpid()}.", ".999999999.")
                       + "x.tmp")
    alive = tmp_path / (models._build_prefix(name) + "y.tmp")
    other_host = tmp_path / f".{name}.otherhost.999999999.z.tmp"
    for path in (dead, alive, other_host):
        path.mkdir()
    ensure_model("tiny", warm_start_steps=0, cache_dir=tmp_path)
    assert not dead.exists() and alive.exists() and other_host.exists()


def test_ensure_model_warm_starts_with_fixed_numerics_whatever_this_process_uses(tmp_path):
    """The warm start runs in a child process with WARM_START_THREADS threads and, on AVX2
    machines, AVX2 kernels (torch's and MKL's), so a model is the same bits whatever thread
    count or ISA the calling process has; the record says what it ran with. (The same recipe
    in this process on 1 and on 2 threads gives other bits: checked when this was written.)"""
    before = torch.get_num_threads()
    built = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            built.append(ensure_model("tiny", warm_start_steps=20,
                                      cache_dir=tmp_path / str(threads)))
    finally:
        torch.set_num_threads(before)
    weights = [(path / "model.safetensors").read_bytes() for path in built]
    assert weights[0] == weights[1]
    numerics = json.loads((built[0] / models.WARM_START_FILE).read_text())["numerics"]
    assert numerics["threads"] == models.WARM_START_THREADS
    if models._has_avx2():
        assert numerics["cpu_capability"] == "AVX2" and numerics["mkl_cbwr"] == "AVX2"


def test_a_failing_warm_start_child_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(models.sys, "executable", "/bin/false")
    with pytest.raises(RuntimeError, match="warm start of .* failed in its child process"):
        ensure_model("tiny", warm_start_steps=2, cache_dir=tmp_path)
    assert all(not p.name.endswith(".tmp") for p in tmp_path.iterdir())
