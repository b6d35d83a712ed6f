# ImageNet in the folder layout: data/imagenet/{train,val}/<wnid>/*.JPEG
# (for a flat val folder add ann_file='val_labels.txt' with "<image> <class index>" lines).
data_root = 'data/imagenet/'
train_dataloader = dict(
    batch_size=32,
    num_workers=8,
    persistent_workers=True,
    sampler=dict(type='DefaultSampler', shuffle=True),
    dataset=dict(type='ImageNetFolder', data_root=data_root + 'train', train=True))
val_dataloader = dict(
    batch_size=64,
    num_workers=8,
    persistent_workers=True,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(type='ImageNetFolder', data_root=data_root + 'val', train=False))
test_dataloader = val_dataloader
val_evaluator = dict(type='TopKAccuracy', topk=(1, 5))
test_evaluator = val_evaluator
