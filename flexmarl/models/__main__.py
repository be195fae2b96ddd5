"""`python -m flexmarl.models DIR --steps N --seed S --metrics FILE`: the warm start's child
process (flexmarl.models.ensure_model starts it with fixed numerics)."""
from flexmarl.models.supervised import _child_main

if __name__ == "__main__":  # imported (the layout test imports every module), it does nothing
    _child_main()
