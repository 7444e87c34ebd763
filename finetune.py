"""LoRA fine-tuning with RoPE scaling (CNNSum Sec 5). See ``python finetune.py --help``; internals in
ropescale/training/."""
import sys

from ropescale.training.env import setup_env

setup_env()  # before torch / DeepSpeed are imported: CPU accelerator, rendezvous defaults

from ropescale.common.cli import prepare_process  # noqa: E402

prepare_process()

from ropescale.training.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
