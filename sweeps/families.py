"""The `families` study as a runnable script, for `ray submit` and `ray job submit` (which need
a file); the same as `scale-fpt sweep families`. Its presets live in scale_fpt/recipes/studies.py;
`python sweeps/families.py --help` lists them and every flag."""

import sys

from scale_fpt.recipes import load_study
from scale_fpt.study import study_main

if __name__ == "__main__":
    study = load_study("families")
    sys.exit(study_main(study.description, study.presets, after=study.after))
