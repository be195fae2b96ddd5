"""Train a workload of bench/peers/workloads.py with TRL's GRPOTrainer (trl==1.16.0), for real.

One of the peers bench/peers.py compares FlexMARL with. Runs in `.venv-peers`:

    .venv-peers/bin/python bench/peers/run_trl.py --workload sums --model DIR --out OUT [--steps 8]

    sums   one GRPOTrainer ("solver"), system "trl"
    joint  two GRPOTrainers ("a", "b"), each its own model copy, alternated step by step by a
           plain loop (each trainer.train() in its own thread; a callback hands a turn token
           back and forth at step boundaries, so exactly one trainer works at a time):
           system "trl-pair"
    duo    the same alternation, solver then checker; the checker's prompts are built at its
           generation time from the solver's completions of the same step (rollout_func)
    mixed  the duo's, with a Gemma 3 270M base solver (--model-dir gemma3-270m=DIR): its
           trainer's prompts are plain text (workloads.render_plain, FlexMARL's rendering for a
           model without a chat template), which TRL tokenizes with the tokenizer's own special
           tokens (Gemma's BOS first); its completions stop at "\\nQuestion:" (below)

Every setting is workloads.Setting's, per agent workloads.agent_setting's (see the GRPOConfig
below); OUT/result.json records step end times, rewards and every deviation that TRL forces
("notes").
"""
import time

T_PROCESS_START = time.time()   # before the heavy imports: the benchmark counts them

import functools  # noqa: E402
import threading  # noqa: E402

import common  # noqa: E402  (sets the offline environment before transformers is imported)
import workloads  # noqa: E402
from workloads import Sum  # noqa: E402

from datasets import Dataset  # noqa: E402
from transformers import AutoTokenizer, TrainerCallback  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402


def text_of(completion) -> str:
    """A completion as TRL hands it to reward functions: conversational prompts give a list of
    messages ([{"role": "assistant", "content": ...}])."""
    return completion[-1]["content"] if isinstance(completion, list) else completion


def config(s: workloads.Setting, out, name: str, plain: bool = False) -> GRPOConfig:
    """The Setting in GRPOConfig's terms. TRL's own defaults that differ from it are set
    explicitly: bf16 (TRL: on), gradient_checkpointing (TRL: on), learning_rate (1e-6),
    lr_scheduler_type (linear), top_k (0 already, kept explicit), optim (adamw_torch_fused).
    `plain`: the plain rendering's stop string, through TRL's generation_kwargs (TRL does not
    give generate() the tokenizer that stop strings need: plain_generate() does)."""
    return GRPOConfig(
        output_dir=str(out / "_trl" / name),
        max_steps=s.steps,
        # One generation round = 4 prompts x 8 completions = one micro-batch = one optimizer
        # step: generation_batch_size = per_device_train_batch_size * steps_per_generation.
        per_device_train_batch_size=s.prompts_per_step * s.group_size,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        num_generations=s.group_size,
        num_iterations=1,                  # one update per batch, no PPO epochs
        shuffle_dataset=False,             # the dataset is laid out in step_tasks() order
        # sampling: TRL's own transformers generate path
        use_vllm=False,
        max_completion_length=s.max_new_tokens,
        temperature=s.temperature,
        top_p=1.0,
        top_k=0,
        generation_kwargs={"stop_strings": [workloads.PLAIN_STOP]} if plain else None,
        # GRPO
        beta=0.0,                          # no KL: TRL then loads no reference model
        epsilon=s.clip_eps,
        scale_rewards="group",             # (r - group mean) / (group std + 1e-4)
        loss_type="dapo",                  # token losses summed, / the batch's token count
        mask_truncated_completions=False,
        # optimizer: AdamW, constant lr, clip 1.0, float32 on CPU
        learning_rate=s.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        optim="adamw_torch",
        adam_beta1=0.9,
        adam_beta2=0.999,
        adam_epsilon=1e-8,
        weight_decay=0.0,
        max_grad_norm=s.grad_clip,
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
        use_cpu=True,
        seed=s.seed,
        data_seed=s.seed,
        dataloader_num_workers=0,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
    )


def prompt_of(messages: list[dict], plain: bool):
    """A prompt as the agent's trainer is given it: chat messages (TRL applies the model's chat
    template) or, for a model without one, the plain rendering as text."""
    return workloads.render_plain(messages) if plain else messages


def dataset(s: workloads.Setting, plain: bool = False) -> Dataset:
    """The solver prompts of every step, in step order (4 rows a step); a and b ride along as
    columns, which TRL passes to the reward functions."""
    rows = [{"prompt": prompt_of(workloads.solver_prompt(t), plain), "a": t.a, "b": t.b}
            for tasks in workloads.step_tasks(s) for t in tasks]
    return Dataset.from_list(rows)


def plain_generate(model, tokenizer) -> None:
    """Give the model's generate() its tokenizer: transformers needs it for stop strings, and
    TRL calls `unwrapped_model.generate(**generate_inputs, generation_config=
    self.generation_config)` without one (GRPOTrainer._generate_single_turn), which raises
    ValueError with stop_strings set. On CPU TRL's unwrapped model is this very object."""
    model.generate = functools.partial(model.generate, tokenizer=tokenizer)


class Turns:
    """A turn token over the agents' names, in order: one trainer works at a time."""

    def __init__(self, order):
        self.order, self.k, self.error = list(order), 0, None
        self.cv = threading.Condition()

    def wait(self, name: str) -> None:
        with self.cv:
            self.cv.wait_for(lambda: self.error is not None
                             or self.order[self.k % len(self.order)] == name)
            if self.error is not None:
                raise RuntimeError(f"{name}: another trainer failed") from self.error

    def done(self) -> None:
        with self.cv:
            self.k += 1
            self.cv.notify_all()

    def fail(self, error: BaseException) -> None:
        with self.cv:
            self.error = error
            self.cv.notify_all()


class StepCallback(TrainerCallback):
    """Waits for this agent's turn before its step and, after its optimizer step, records the
    step (when it is the last agent of the round) and passes the turn on."""

    def __init__(self, name: str, turns: Turns | None, step_end):
        self.name, self.turns, self.step_end = name, turns, step_end

    def on_step_begin(self, args, state, control, **kwargs):
        if self.turns is not None:
            self.turns.wait(self.name)

    def on_step_end(self, args, state, control, **kwargs):
        self.step_end(self.name)
        if self.turns is not None:
            self.turns.done()


def main() -> None:
    args = common.parse_args(__doc__.splitlines()[0])
    s = common.setting(args)
    agents = workloads.AGENTS[args.workload]
    flow = workloads.WORKFLOW[args.workload]
    settings = {a: workloads.agent_setting(s, args.workload, a) for a in agents}
    system = "trl" if len(agents) == 1 else "trl-pair"
    result = common.Result(system, args, T_PROCESS_START,
                           common.versions(*common.PACKAGES))
    common.seed_all(s.seed)
    notes = result.note
    notes("advantages: TRL divides by the group's Bessel-corrected std + 1e-4 (FlexMARL: the "
          "population std + 1e-6); 8 samples of 0/1 rewards: a factor sqrt(7/8) apart")
    notes("reward in steps[]: each agent's own correctness right() averaged over its 32 samples")

    tokenizers = {a: AutoTokenizer.from_pretrained(settings[a].model, padding_side="left")
                  for a in agents}
    plain = {a: common.plain_format(tokenizers[a]) for a in agents}
    rewards = {a: [] for a in agents}   # this step's rewards, per agent
    solver_rows: list = []              # duo: the solver's (text, a, b) this step
    claim_counts = [0, 0]               # duo: checker prompts with a solver claim, all of them
    stops = {a: [0, 0] for a in agents}  # plain agents: completions cut at the stop, all of them

    def reward_fn_for(name: str):
        def reward(prompts, completions, a, b, **kwargs):
            texts = [text_of(c) for c in completions]
            if plain[name]:   # the text before the stop, as FlexMARL's engines return it
                texts = [workloads.cut_at_stop(t) for t in texts]
            r = [workloads.right(t, Sum(x, y)) for t, x, y in zip(texts, a, b)]
            rewards[name].extend(r)
            if flow == "duo" and name == "solver":
                solver_rows[:] = list(zip(texts, a, b))
            return r
        reward.__name__ = f"right_{name}"   # TRL names its reward columns after the function
        return reward

    def generate(trainer, name: str, prompts) -> dict:
        """TRL's own transformers path (its private _tokenize_prompts and
        _generate_single_turn); for a plain agent each completion is then cut after the token
        that completes the stop, FlexMARL's engine's rule: transformers stops a row there but
        pads it to the batch's end with <pad>, and TRL masks only after an EOS."""
        prompt_ids, images, fields = trainer._tokenize_prompts(prompts)
        completion_ids, logprobs = trainer._generate_single_turn(prompt_ids, images, fields,
                                                                 trainer.num_generations)
        if plain[name]:
            tok = tokenizers[name]
            decode = functools.partial(tok.decode, skip_special_tokens=True)
            cut = [ids[:workloads.stop_length(ids, decode)] for ids in completion_ids]
            stops[name][0] += sum(workloads.PLAIN_STOP in decode(c) for c in cut)
            stops[name][1] += len(cut)
            if logprobs is not None:
                logprobs = [lp[:len(c)] for lp, c in zip(logprobs, cut)]
            completion_ids = cut
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": logprobs}

    def checker_rollout(prompts, trainer):
        """duo: the checker's real prompts, built now (its turn: the solver has finished this
        step) from the solver's completion in the same row, then generated by TRL's own
        transformers path. The rows come in the same order as the solver's (the same tasks,
        unshuffled), so row i of the checker's group for a task sees the claim of the solver's
        sample i of that task, as in FlexMARL's workflow."""
        if len(solver_rows) != len(prompts) or any(
                p != prompt_of(workloads.solver_prompt(Sum(a, b)), plain["checker"])
                for p, (_, a, b) in zip(prompts, solver_rows)):
            raise RuntimeError("the checker's rows do not match the solver's of this step")
        claims = [workloads.last_number(text) for text, _, _ in solver_rows]
        msgs = [prompt_of(workloads.checker_prompt(Sum(a, b), claim), plain["checker"])
                for (_, a, b), claim in zip(solver_rows, claims)]
        claim_counts[0] += sum(c is not None for c in claims)
        claim_counts[1] += len(claims)
        return generate(trainer, "checker", msgs)

    def rollout_for(name: str):
        """The checker of the duo's workflow: its prompts from the solver's completions; a plain
        agent otherwise: its dataset prompts, cut at the stop (generate); else TRL's own."""
        if flow == "duo" and name == "checker":
            return checker_rollout
        if plain[name]:
            return lambda prompts, trainer: generate(trainer, name, prompts)
        return None

    def step_end(name: str) -> None:
        if name != agents[-1]:
            return   # a step of result.json: every agent has stepped once
        result.step(samples=sum(len(rewards[a]) for a in agents),   # as scored
                    reward={a: common.mean(rewards[a]) for a in agents})
        for a in agents:
            rewards[a].clear()

    turns = Turns(agents) if len(agents) > 1 else None
    models, trainers = {}, {}
    for name in agents:
        sa, tokenizer = settings[name], tokenizers[name]
        if plain[name]:
            common.check_plain_encoding(tokenizer)
        else:
            common.check_no_double_special(tokenizer)
        models[name] = common.load_policy(sa.model, sa)
        if plain[name]:
            plain_generate(models[name], tokenizer)
        trainers[name] = GRPOTrainer(
            model=models[name], reward_funcs=reward_fn_for(name),
            args=config(sa, result.out, name, plain[name]),
            train_dataset=dataset(s, plain[name]), processing_class=tokenizer,
            callbacks=[StepCallback(name, turns, step_end)], rollout_func=rollout_for(name))
        if plain[name]:
            # The prompt TRL makes of a plain-text row: its own call, FlexMARL's token ids.
            text = trainers[name].train_dataset[0]["prompt"]
            ids = trainers[name]._tokenize_prompts([text])[0][0]
            if list(ids) != tokenizer.encode(text, add_special_tokens=True):
                raise RuntimeError(f"{name}: TRL's prompt ids differ from FlexMARL's encoding")
    if args.workload == "joint":
        notes("joint: each trainer is rewarded with its own right() rather than the joint "
              "(right(a) + right(b)) / 2: for a fixed partner the joint reward is the agent's "
              "own reward halved plus a term independent of its sample, so the expected gradient "
              "points the same way; TRL cannot feed one trainer's samples to another's reward "
              "(the two trainers' samples are not paired)")
    if flow == "duo":
        notes("duo: the checker's prompts are built inside a rollout_func (TRL's experimental "
              "hook) that calls the trainer's own _tokenize_prompts and _generate_single_turn "
              "(private methods: TRL's standard transformers generate path); its dataset prompt "
              "is a placeholder (the solver prompt) used only to identify the task")
    if any(plain.values()):
        names = ", ".join(a for a in agents if plain[a])
        notes(f"{args.workload}: {names} (no chat template) gets plain-text prompts rendered as "
              "FlexMARL renders them (workloads.render_plain, tested equal to flexmarl."
              "orchestrator.prompts.render_plain); TRL tokenizes plain text with "
              "processing_class(text=prompts), add_special_tokens=True, so the BOS comes first: "
              "the prompt ids are checked equal to FlexMARL's encode at start-up")
        notes(f"{args.workload}: {names} stops at \"\\nQuestion:\" through "
              "generation_kwargs={'stop_strings': [...]}, with the model's generate() given "
              "the tokenizer TRL does not pass (transformers refuses stop strings without it); "
              "a rollout_func around TRL's own _tokenize_prompts/_generate_single_turn cuts "
              "each completion after the token that completes the stop (the <pad> tokens "
              "transformers appends after a stop are not masked by TRL, which masks after an "
              "EOS only), so the stop's own tokens are trained, as in FlexMARL; the reward "
              "reads the text before the stop, as FlexMARL's engines return it")
    if len({(x.model, x.lr, x.max_new_tokens) for x in settings.values()}) > 1:
        notes(f"{args.workload}: per agent: " + "; ".join(
            f"{a} {settings[a].family} lr {settings[a].lr:g} {settings[a].max_new_tokens} "
            "new tokens" for a in agents))
    if turns is not None:
        notes("two GRPOTrainers alternated by a turn token at on_step_begin/on_step_end, each "
              "trainer.train() in its own thread; each step's end is stamped after the last "
              "agent's optimizer step; t_train_start is before both train() calls")

    result.train_start()
    if turns is None:
        trainers[agents[0]].train()
    else:
        errors = []

        def run(name):
            try:
                trainers[name].train()
            except BaseException as e:   # wake the other trainer instead of leaving it waiting
                errors.append(e)
                turns.fail(e)

        threads = [threading.Thread(target=run, args=(n,), name=f"trl-{n}") for n in agents]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]

    if flow == "duo":
        notes(f"{args.workload}: {claim_counts[0]} of {claim_counts[1]} checker prompts carried "
              "the solver's claim (the others: no number in the solver's answer, so the solver "
              "prompt)")
    for name in agents:
        if plain[name]:
            notes(f"{args.workload}: {stops[name][0]} of {stops[name][1]} {name} completions "
                  "ended at the stop (the others at the token budget or an EOS)")
    for name in agents:
        result.save_agent(name, models[name], settings[name].model)
    result.write()
    common.remove_empty_dirs(result.out / "_trl")   # save_strategy="no": TRL leaves them empty
    print(f"[peers] wrote {result.out / 'result.json'}", flush=True)


if __name__ == "__main__":
    main()
