# ResNet-101 baseline on the GSA paper's schedule (GSA Table 6): 16 GPUs x 128 = 2048 images,
# 90 epochs, cosine, label smoothing 0.1.
_base_ = ['../_base_/models/classifier_r50.py', '../_base_/datasets/imagenet.py',
          '../_base_/schedules/imagenet_gsa_90e.py', '../_base_/classification_runtime.py']
model = dict(label_smoothing=0.1, backbone=dict(depth=101))
train_dataloader = dict(batch_size=128)
