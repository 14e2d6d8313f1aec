#!/usr/bin/env python3
"""Writes a NeMo megatron_gpt_config.yaml fixture for nemo_hydra.py: the configuration data of
NeMo's own file (keys, values, interpolations, the defaults list), its comments left out, under
a header that cites where it came from.

Usage: PYTHON tests/clients/nemo_yaml_gen.py SOURCE.yaml REF COMMIT > tests/clients/nemo-REF/megatron_gpt_config.yaml

SOURCE.yaml is NVIDIA/NeMo's examples/nlp/language_modeling/conf/megatron_gpt_config.yaml at
COMMIT (REF names it: a tag or the short commit); PYTHON is scripts/clients.sh nemo's
(omegaconf). No PyPI package ships the file: nemo_toolkit's wheels hold the nemo package only,
and `pip download --no-binary :all: nemo_toolkit==1.23.0` stops in the sdist's setup.py
(requirements/requirements.txt missing), so the fixture is committed.
"""
import sys

from omegaconf import OmegaConf


def main():
    if len(sys.argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    path, ref, commit = sys.argv[1:]
    cfg = OmegaConf.load(path)  # OmegaConf's loader, as Hydra's: 1e-5 is a float
    sys.stdout.write(
        f"# NVIDIA/NeMo {ref} ({commit}):\n"
        "# examples/nlp/language_modeling/conf/megatron_gpt_config.yaml, the configuration data of\n"
        "# that file with its comments left out (tests/clients/nemo_yaml_gen.py wrote it). Apache-2.0.\n"
        + OmegaConf.to_yaml(cfg, resolve=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
