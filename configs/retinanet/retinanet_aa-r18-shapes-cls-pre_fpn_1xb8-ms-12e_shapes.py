# The embedded two-step recipe: the demo detector with its backbone initialised
# from the classification demo's checkpoint (`.venv/bin/python
# demo/classification_demo.py` writes it):
#   .venv/bin/python demo/detection_demo.py --config
#   configs/retinanet/retinanet_aa-r18-shapes-cls-pre_fpn_1xb8-ms-12e_shapes.py
#   \
#       --work-dir work_dirs/demo_shapes_pretrained
_base_ = './retinanet_aa-r18-scratch_fpn_1xb8-ms-12e_shapes.py'
model = dict(
    backbone=dict(
        init_cfg=dict(
            _delete_=True,
            type='Pretrained',
            prefix='backbone.',
            checkpoint='work_dirs/demo_shapes_cls/epoch_20.pth')))
