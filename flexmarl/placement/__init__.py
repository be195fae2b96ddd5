"""Where things run: the run's workers on hosts, devices and cores, decided before any process
starts (and kept up to date as workers are replaced or nodes join).

Two words, used in this sense everywhere in FlexMARL:

- **placement**: which host, devices (GPUs) and cores each worker gets, and which agent each
  rollout instance serves. `devices.placement` picks its kind ("disaggregated", or agents
  time-sharing their devices); the simulator's `Placement` is one such layout it prices.
- **plan**: the simulator's search over placements (flexmarl.sim.plan, `flexmarl plan`): the
  fastest placement for a team on a cluster, written as config. Nothing else is a plan.

    devices.py      Host, Ask, Seat, DevicePlacement: which GPUs each worker owns, on which
                    host (place_devices: best fit, largest asks first)
    layout.py       the trainer slots (slot_layout, time-shared groups pinned to their own
                    slot), the GPU placement of the whole team (place_gpus) and the weight
                    transfer it allows (resolve_transfer)
    lora_units.py   which LoRA agents share rollout instances (one unit per base model) and,
                    by default, one trainer slot (static_slots: trainer_pool.share_lora_base)
    timeshare.py    TimeShare: the arbiter of one time-shared group of devices, its agents'
                    engines or one trainer at a time (pure asyncio; the simulator runs it too)
    cores.py        this machine's cores per role, the trainers' niceness and seriality

A leaf of the house: it imports the config, flexmarl.checks, flexmarl.team and flexmarl.clock,
no process, pool or engine code (tests/test_layout.py). What acts on the workers it places
(starting them, switching a time-shared group) is in flexmarl.launch.
"""
