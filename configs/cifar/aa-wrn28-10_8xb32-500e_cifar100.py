# AA-Wide-ResNet-28-10 on CIFAR-100 (AA paper Table 1, 36.2M): the first conv
# of every block augmented (Nh = 8, kappa = 2 upsilon = 0.2, >= 20 key dims per
# head, no attention downsampling); batch 256 (8 GPUs x 32), lr 0.2 * 256 /
# 256 = 0.2, weight decay 5e-4 (appendix A.1).
_base_ = './wrn28-10_8xb128-500e_cifar100.py'
model = dict(
    backbone=dict(
        attention=dict(
            key_ratio=0.2,
            value_ratio=0.1,
            num_heads=8,
            min_key_dim_per_head=20)))
train_dataloader = dict(batch_size=32)
optim_wrapper = dict(optimizer=dict(lr=0.2, weight_decay=5e-4))
auto_scale_lr = dict(base_batch_size=256)
