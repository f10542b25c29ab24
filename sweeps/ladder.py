"""The `ladder` study as a runnable script, for `ray submit` and `ray job submit` (which need a
file); the same as `scale-fpt sweep ladder`. Its presets live in scale_fpt/recipes/studies.py;
`python sweeps/ladder.py --help` lists them and every flag."""

import os
import sys

# Spinning OpenMP threads lose their time slices to any other work on the machine: on a
# shared 2-core box a gpt2-tiny pretraining step took 2.4 s instead of 0.11 s. Passive
# waiting costs little on a dedicated machine; set before torch loads (here and in the Ray
# workers, which inherit it). OMP_WAIT_POLICY=ACTIVE overrides.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from scale_fpt.recipes import load_study
from scale_fpt.study import study_main

if __name__ == "__main__":
    study = load_study("ladder")
    sys.exit(study_main(study.description, study.presets, after=study.after))
