model = dict(
    type='ImageClassifier',
    num_classes=1000,
    data_preprocessor=dict(
        type='ImgDataPreprocessor', mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375]),
    backbone=dict(type='ResNet', depth=50, norm_cfg=dict(type='SyncBN', requires_grad=True),
                  norm_eval=False, frozen_stages=-1, init_cfg=None))
