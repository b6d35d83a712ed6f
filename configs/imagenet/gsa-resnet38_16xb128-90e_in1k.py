# GSA-ResNet-38 (GSA paper Table 6): 16 GPUs x 128 = 2048 images, cosine, label smoothing 0.1.
_base_ = ['../_base_/models/classifier_r50.py', '../_base_/datasets/imagenet.py',
          '../_base_/schedules/imagenet_gsa_90e.py', '../_base_/classification_runtime.py']
model = dict(label_smoothing=0.1, backbone=dict(type='GSAResNet', depth=38))
train_dataloader = dict(batch_size=128)
