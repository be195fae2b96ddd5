"""Train a workload of bench/peers/workloads.py with CoMLRL's MAGRPOTrainer (comlrl==1.4.0).

One of the peers bench/peers.py compares FlexMARL with. Runs in `.venv-peers`:

    .venv-peers/bin/python bench/peers/run_comlrl.py --workload joint --model DIR --out OUT

    joint  agents "a" and "b" both answer the same sum; one shared reward per joint sample,
           workloads.joint_reward: CoMLRL's native shape (joint_mode="aligned": completion i
           of a is paired with completion i of b, 8 joint samples per prompt)
    sums   one agent ("solver"): MAGRPO's single-agent case (num_agents=1, plain GRPO)
    duo    not expressible (result.json says why: "unsupported")
    mixed  not expressible: the duo's workflow (as above); the two families would load
           (MAGRPOTrainer takes one model and one tokenizer per agent) but not with the
           workload's per-agent new tokens (MIXED_UNSUPPORTED says exactly)

What CoMLRL does, read from comlrl/trainers/reinforce/magrpo.py (1.4.0):
  - one dataset item per rollout; each agent samples num_generations completions of it with
    HF generate; rollouts go to a per-agent buffer and every rollout_buffer_size items the
    agent takes one optimizer step per train_batch_size items (here 4 and 4: one step per 4
    prompts x 8 samples = 32 samples an agent);
  - advantages: r - group mean, then (advantage_normalization) / the group's population std
    (clamped at 1e-6); one shared scalar reward per joint sample;
  - loss: per completion -A * (sum of its tokens' log-probs, at temperature 1), averaged over
    the group's completions and over the items of the batch; no importance ratio or clipping
    (on-policy REINFORCE: the gradient GRPO has with one update per batch), no token-count
    normalisation, no reference model unless reference_kl_enabled.
The optimizer CoMLRL builds (torch AdamW with its default weight_decay=0.01, no grad clipping,
over all parameters) is replaced through the trainer's `optimizers` attribute by one with the
Setting's: AdamW(trained params, lr, betas, eps, weight_decay=0) and grad-norm clipping 1.0 as
an optimizer step pre-hook.
"""
import time

T_PROCESS_START = time.time()   # before the heavy imports: the benchmark counts them

import common  # noqa: E402  (sets the offline environment before transformers is imported)
import workloads  # noqa: E402
from workloads import Sum  # noqa: E402

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402
from comlrl.trainers.reinforce.magrpo import MAGRPOConfig, MAGRPOTrainer  # noqa: E402

# SmolLM2's pad token is its eos, <|im_end|>, which every chat prompt contains. CoMLRL takes the
# first pad token of the (unpadded, one-item) prompt as the prompt's end
# (magrpo.py _generate_completions: prompt_len = first pad position): with <|im_end|> the
# "prompt" would end after the system message and every completion would be read as empty.
# So CoMLRL gets a tokenizer whose pad is <|endoftext|> (id 0, never in a prompt), and the
# models pad generations with it too, so its response lengths stay right.
PAD_TOKEN = "<|endoftext|>"

DUO_UNSUPPORTED = (
    "CoMLRL 1.4.0's MAGRPOTrainer cannot express the duo's sequential solver -> checker workflow: "
    "its multi-turn mode (num_turns > 1 with an external_transition that builds the next turn's "
    "prompts from the previous turn's completions) makes EVERY agent generate and train at "
    "EVERY turn (no API to let only the solver act in turn 1 and only the checker in turn 2; "
    "_train_step_returns generates with all agents in build_node), each turn-1 joint sample "
    "branches into num_generations turn-2 samples (a G + G^2 tree per agent), and the reward "
    "is one scalar per joint action shared by all agents (_compute_rewards keeps "
    "processed_rewards[0]; there are no per-agent rewards), while the duo rewards each agent "
    "for its own answer. (Also, by default early_termination_threshold=-0.2 stops the "
    "branch before turn 2 whenever the turn-1 mean reward exceeds -0.2, i.e. always with 0/1 "
    "rewards.) In a single turn a formatter sees only the dataset item, never another "
    "agent's completion."
)


MIXED_UNSUPPORTED = (
    "mixed is the duo's workflow with a Gemma 3 270M base solver and a SmolLM2 checker, so "
    "first of all: " + DUO_UNSUPPORTED + " The two families themselves would load: "
    "MAGRPOTrainer.__init__(..., agents: Optional[List[PreTrainedModel]], tokenizer: "
    "Optional[Union[PreTrainedTokenizerBase, Sequence[PreTrainedTokenizerBase]]], ..., "
    "formatters: Optional[Union[Callable, Sequence[Callable]]]) takes a model, a tokenizer and a "
    "formatter per agent (resolve_tokenizers: 'tokenizers length must match agents'; "
    "_generate_completions uses self.tokenizers[agent_idx]), and its optimizers can be "
    "replaced per agent (the lr: 3e-6 Gemma, 1e-4 SmolLM2). But the new tokens cannot be set "
    "per agent (the workload: 16 for Gemma, 12 for SmolLM2): MAGRPOConfig has one "
    "max_new_tokens, and build_node calls every agent's _generate_completions_with_external_"
    "prompts(..., max_new_tokens=self.args.max_new_tokens, **kwargs); the only other way into "
    "generate(), trainer.train(**kwargs), reaches every agent's generate() alike, so the Gemma "
    "solver's stop string (\\nQuestion:, with the tokenizer transformers needs for it) would "
    "go to the SmolLM2 checker too."
)


def main() -> None:
    args = common.parse_args(__doc__.splitlines()[0])
    result = common.Result("comlrl", args, T_PROCESS_START, common.versions(*common.PACKAGES))
    if args.workload in ("duo", "mixed"):
        result.unsupported(DUO_UNSUPPORTED if args.workload == "duo" else MIXED_UNSUPPORTED)
        print(f"[peers] {args.workload}: unsupported; wrote {result.out / 'result.json'}",
              flush=True)
        return
    s = common.setting(args)
    agents = workloads.AGENTS[args.workload]
    common.seed_all(s.seed)
    notes = result.note
    notes("loss: per completion -A * sum of its token log-probs, averaged over the 32 "
          "completions (FlexMARL: summed over tokens / the batch's response-token count): the "
          "same direction, a scale larger by the mean completion length, which matters "
          "through the grad clip at 1.0")
    notes("log-probs in the loss are at temperature 1 (raw logits) though sampling is at 0.7 "
          "(FlexMARL and TRL score at the sampling temperature)")
    notes("the loss also counts the pad tokens after a completion's end: CoMLRL trains on the "
          "whole generated row of each completion (padded to the group's longest), "
          "_pack_completions_for_buffer/_compute_loss_with_gradients ignore response_lens")
    notes("no importance ratio / clip: on-policy REINFORCE, equal in gradient to GRPO with one "
          "update per batch (ratio 1), so clip_eps is never active")
    notes(f"tokenizer pad set to {PAD_TOKEN} (SmolLM2's pad is its eos <|im_end|>, which CoMLRL "
          "would take for the end of the prompt); the saved agents carry the original tokenizer")
    notes("optimizer: CoMLRL's own AdamW (weight_decay=0.01, no clipping) replaced via "
          "trainer.optimizers with AdamW(weight_decay=0) + clip_grad_norm_(1.0) pre-hook")
    notes("within a step CoMLRL shuffles the 4 rollouts (random.shuffle, seeded): the order of "
          "gradient accumulation only")
    notes("reward in steps[]: each agent's own correctness right() averaged over its 32 samples"
          + ("; both are trained on the shared joint reward (right(a) + right(b)) / 2"
             if args.workload == "joint" else ""))

    tokenizer = AutoTokenizer.from_pretrained(s.model)
    common.check_no_double_special(tokenizer)
    tokenizer.pad_token = PAD_TOKEN
    models = [common.load_policy(s.model, s) for _ in agents]
    for m in models:
        m.generation_config.pad_token_id = tokenizer.pad_token_id

    # The step's tasks in order: CoMLRL's dataloader is unshuffled with batch size 1, so
    # dataset order is rollout order, and every 4 items make one optimizer step.
    rows = [{"a": t.a, "b": t.b} for tasks in workloads.step_tasks(s) for t in tasks]
    data = Dataset.from_list(rows)

    def formatter(item) -> str:
        return common.chat_text(tokenizer, workloads.solver_prompt(Sum(item["a"], item["b"])))

    rewards = {a: [] for a in agents}   # this step's own-correctness per agent

    def task_of(batch_items) -> Sum:
        return Sum(batch_items[0]["a"], batch_items[0]["b"])

    # CoMLRL calls the reward once per joint sample with one completion per agent.
    if args.workload == "sums":
        def reward_func(completions, *, batch_items=None):
            r = workloads.right(completions[0], task_of(batch_items))
            rewards["solver"].append(r)
            return [r]
    else:
        def reward_func(completions_a, completions_b, *, batch_items=None):
            task = task_of(batch_items)
            ta, tb = completions_a[0], completions_b[0]
            rewards["a"].append(workloads.right(ta, task))
            rewards["b"].append(workloads.right(tb, task))
            return [workloads.joint_reward(ta, tb, task)]

    config = MAGRPOConfig(
        num_train_epochs=1,                    # the dataset holds exactly `steps` steps
        agent_learning_rate=s.lr,
        num_agents=len(agents),
        num_generations=s.group_size,
        max_new_tokens=s.max_new_tokens,
        temperature=s.temperature,
        top_p=1.0,
        top_k=0,                               # None would mean transformers' default 50
        num_turns=1,
        joint_mode="aligned",
        rollout_buffer_size=s.prompts_per_step,
        train_batch_size=s.prompts_per_step,
        advantage_mode="mean",
        advantage_normalization=True,
        reference_kl_enabled=False,
        eval_interval=0,                       # no evaluation rollouts during training
        eval_num_samples=0,
        logging_steps=1,
    )
    trainer = MAGRPOTrainer(
        agents=models, num_agents=len(agents), tokenizer=tokenizer, train_dataset=data,
        reward_func=reward_func, formatters=[formatter] * len(agents), args=config,
        wandb_config=None)

    # The Setting's optimizer, one per agent, in place of CoMLRL's; its hooks clip the
    # gradients before each step and stamp the step's end once every agent has stepped.
    stepped = [0] * len(agents)

    def after_step(i: int) -> None:
        stepped[i] += 1
        if min(stepped) > len(result.data["steps"]):
            result.step(samples=sum(len(rewards[a]) for a in agents),   # as scored
                        reward={a: common.mean(rewards[a]) for a in agents})
            for a in agents:
                rewards[a].clear()

    def clip_hook(params):
        def hook(optimizer, args_, kwargs_):
            torch.nn.utils.clip_grad_norm_(params, s.grad_clip)   # a pre-hook returns None
        return hook

    for i, m in enumerate(models):
        params = [p for p in m.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=s.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
        opt.register_step_pre_hook(clip_hook(params))
        opt.register_step_post_hook(lambda o, a, k, i=i: after_step(i))
        trainer.optimizers[i] = opt

    result.train_start()
    trainer.train()

    for name, m in zip(agents, models):
        result.save_agent(name, m, s.model)
    result.write()
    print(f"[peers] wrote {result.out / 'result.json'}", flush=True)


if __name__ == "__main__":
    main()
