# The official I-JEPA ViT-H/14 recipe on ImageNet-1k (jepa_cli/recipes/ijepa-in1k-vith14.toml: every value of
# the official configs/in1k_vith14_ep300.yaml), from the ImageNet folders to the probe table. The
# steps and their files are recipes/quickstart.mk's; the train and validation folders are two sources.
#
#   make -f recipes/ijepa-in1k.mk IN1K=/data/imagenet [OUT=in1k] [MESH=data=-1,fsdp=8]
#
# IN1K holds train/ and val/, each with one subfolder per class (the layout torchvision's ImageFolder
# reads). Ingest stores 256x256 RGB (SIZE; the training crop is 224): 1,281,167 x 196,608 bytes is
# about 252 GB for train/ and 9.8 GB for val/ (photographs barely compress: 1,000 test JPEGs took
# 189 MB for 196 MB raw). Measured here: 218 images/s on 2 CPU cores from 500x375 JPEGs, so about
# 1 h 40 min for train/ (docs/recipes.md). Training is 300 epochs on a GPU or TPU slice
# (docs/distributed.md); pass --save-every in TRAIN_FLAGS and rerun with --resume after a preemption.

HERE := $(dir $(lastword $(MAKEFILE_LIST)))
IN1K ?= $(error set IN1K=/path/to/imagenet (with train/ and val/))
OUT ?= in1k
TRAIN_SOURCE ?= $(IN1K)/train
TEST_SOURCE ?= $(IN1K)/val
SIZE ?= 256x256
IMAGE_SIZE ?=  # the recipe's 224x224 crops of the 256x256 images, as the official recipe
RECIPE ?= $(HERE)../jepa_cli/recipes/ijepa-in1k-vith14.toml
INGEST_FLAGS ?= --channels 3 --skip-bad
TITLE ?= ImageNet-1k val
RAW_PROBES ?=  # raw 256x256 pixels of 1.28M images do not fit in memory: the table has the two encoders

include $(HERE)quickstart.mk
