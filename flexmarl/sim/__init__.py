"""The cluster simulator: the product's scheduling code on a virtual clock (see cluster.py).

    cluster.py    the product's own scheduling code on simulated hardware: systems, simulate,
                  compare
    clock.py      a virtual-time asyncio event loop: when nothing is runnable, time jumps to
                  the next timer
    costs.py      the cost model: service times from bytes, FLOPs and bandwidths (costs.toml,
                  costs_cpu.toml)
    engines.py    simulated engines behind the real interfaces: service times from the cost
                  model
    devices.py    the simulated devices under them: utilisation, one resident mode at a time
    layouts.py    which simulated devices do what: rollout instances per agent, trainer slots,
                  device groups
    presets.py    workload presets shaped like the paper's: teams, their workflows and their
                  deployment
    bounds.py     lower bounds on a preset's step time, measured on the systems' layouts
    plan.py       placement planning: where a team trains and rolls out, and how
    team_plan.py  a user's team and config as a workload: `flexmarl plan`,
                  trainer_pool.slots = "auto"
    cpu_cores.py  devices.cores = "auto": a team's rollout and training on a CPU machine's
                  cores, split or shared, priced (costs_cpu.toml [cores])
    workload.py   skewed multi-agent workloads for the routing comparison: pure, seeded
    routing.py    the routing comparison: a skewed workload through the real rollout pool
"""
