# CIFAR-100, python version: data/cifar100/cifar-100-python/{train,test,meta}
# (https://www.cs.toronto.edu/~kriz/cifar.html; nothing is downloaded).
data_root = 'data/cifar100/'
train_dataloader = dict(
    batch_size=128,
    num_workers=4,
    persistent_workers=True,
    sampler=dict(type='DefaultSampler', shuffle=True),
    dataset=dict(type='CIFAR100Dataset', data_root=data_root, train=True))
val_dataloader = dict(
    batch_size=256,
    num_workers=4,
    persistent_workers=True,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(type='CIFAR100Dataset', data_root=data_root, train=False))
test_dataloader = val_dataloader
val_evaluator = dict(type='TopKAccuracy', topk=(1, 5))
test_evaluator = val_evaluator
