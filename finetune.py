"""LoRA fine-tuning with RoPE scaling (CNNSum Sec 5). See ``python finetune.py --help``; internals in
ropescale/training/."""
import sys

from ropescale.common.process import prepare_process, setup_env

setup_env()  # before torch / DeepSpeed are imported: CPU accelerator, rendezvous defaults
prepare_process()

from ropescale.training.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
