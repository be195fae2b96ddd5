"""Weight sync pieces shared by the trainer's side and the instance's side (a leaf both import).

    codec.py    CUDA IPC handles as plain data (no pickle): encoded by the trainer
                (flexmarl.training.transfer), decoded by the instance (flexmarl.rollout.transfer)
"""
