"""scale_fpt: scaling studies of Frozen Pretrained Transformers (Ray Tune + DeepSpeed + Parquet).

Importing the package has no side effects; import the submodules you need.
"""

__version__ = "0.1.0"
