# Your own images to a probed encoder: a folder with one subfolder per class (the class names are
# the subfolders'), cut into a stratified 80/20 train/test split, I-JEPA pretraining, and the linear
# and k-NN probes of the raw pixels, the random initialisation and the pretrained encoder
# (OUT/table.txt). The steps and their files are recipes/quickstart.mk's.
#
#   make -f recipes/ijepa-folder.mk SOURCE=path/to/images [OUT=folder-run] [SIZE=32x32] [STEPS=1500]
#
# The default RECIPE is jepa_cli/recipes/ijepa-small32.toml (a 6-block, 128-wide ViT with 4x4 patches for
# 32x32 images; 1,500 updates of 128 took 29-37 min on CIFAR-10 on 2 CPU cores, docs/small-data.md).
# For larger images raise SIZE (the dataset and the model both take it) and pass a larger model, e.g.
# MODEL_FLAGS="--model small --patch-size 16".

HERE := $(dir $(lastword $(MAKEFILE_LIST)))
SOURCE ?= $(error set SOURCE=path/to/images (one subfolder per class))
OUT ?= folder-run
SIZE ?= 32x32
RECIPE ?= $(HERE)../jepa_cli/recipes/ijepa-small32.toml
INGEST_FLAGS ?= --channels 3 --skip-bad

include $(HERE)quickstart.mk
