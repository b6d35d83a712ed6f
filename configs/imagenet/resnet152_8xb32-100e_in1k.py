# ResNet-152 baseline on the AA paper's schedule (8 GPUs x 32 = 256 images).
_base_ = ['../_base_/models/classifier_r50.py', '../_base_/datasets/imagenet.py',
          '../_base_/schedules/imagenet_aa_100e.py', '../_base_/classification_runtime.py']
model = dict(backbone=dict(depth=152))
