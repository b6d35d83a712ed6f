# The embedded two-step recipe: the demo detector with its backbone initialised from the
# classification demo's checkpoint (`.venv/bin/python tools/demo_classification.py` writes it):
#   .venv/bin/python tools/demo.py --config configs/retinanet/retinanet_aa-r18_fpn_shapes-cls-pretrained_demo_shapes.py \
#       --work-dir work_dirs/demo_shapes_pretrained
_base_ = './retinanet_aa-r18_fpn_scratch-demo_shapes.py'
model = dict(backbone=dict(init_cfg=dict(_delete_=True, type='Pretrained', prefix='backbone.',
                                         checkpoint='work_dirs/demo_shapes_cls/epoch_10.pth')))
