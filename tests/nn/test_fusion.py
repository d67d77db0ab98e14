"""The fusion pass (nn/fusion.py): pairs are linked where the planner fuses them, asked by
name; the chain, not the layers, hands a fused pair's output on; a slice of a model's
layers (a pipeline stage) runs its pairs fused as the whole model does."""
import numpy as np
import pytest

from distnn.kernels import planner as plan
from distnn.nn import (Add, BatchNormalization, Conv2D, Dense, Flatten, GlobalAvgPool2D, ReLU,
                       Sequential, fusion)


def model(dtype=np.float64):
    return Sequential([Conv2D(3, 3, padding=1), BatchNormalization(), ReLU(),
                       Add([Conv2D(3, 3, padding=1), BatchNormalization()], []), ReLU(),
                       Add([Conv2D(3, 3, padding=1), BatchNormalization()], []), ReLU(),
                       GlobalAvgPool2D(), Flatten(), Dense(2)], input_shape=(2, 5, 5),
                      dtype=dtype, rng=0)


def test_the_planner_answers_each_fusion_by_name():
    assert set(plan.FUSIONS) == {"bn_relu", "add_relu"}
    assert plan.fuses("bn_relu", np.float32) and plan.fuses("add_relu", np.float64)
    assert not plan.fuses("add_relu", np.int32)
    assert not plan.fuses("add_relu", np.float32, plan.Limits(add_relu=False))
    with pytest.raises(ValueError, match="fusion name: one of bn_relu, add_relu; got 'mul'"):
        plan.fuses("mul", np.float32)


def test_each_layer_declares_its_fusion_and_the_pass_links_the_pairs():
    m = model()
    bn, relu, first, relu1, second, relu2 = m.layers[1:7]
    assert (BatchNormalization.relu_fusion, Add.relu_fusion) == ("bn_relu", "add_relu")
    assert bn.fused_relu is relu and first.fused_relu is relu1 and second.fused_relu is relu2
    assert first.upstream is None and second.upstream is first
    fusion.set_add_relu_fusion(m, False)
    assert first.fused_relu is None and second.upstream is None and bn.fused_relu is relu
    fusion.set_bn_relu_fusion(m, False)
    assert bn.fused_relu is None


def test_the_chain_hands_the_rectified_output_on():
    m = model()
    x = np.random.default_rng(0).standard_normal((3, 2, 5, 5))
    y = m.forward(x, training=True)
    relu = m.layers[2]
    assert relu._passed  # the chain called pass_on: the batch norm's output is rectified
    other = relu._y - 1.0
    np.testing.assert_array_equal(relu.forward(other, training=True), np.maximum(other, 0))
    assert not relu._passed  # called alone, a linked ReLU still computes
    plain = model()
    fusion.set_bn_relu_fusion(plain, False)
    fusion.set_add_relu_fusion(plain, False)
    np.testing.assert_array_equal(y, plain.forward(x, training=True))


def test_a_slice_of_the_layers_runs_fused_as_the_model_does():
    whole, parts = model(), model()
    x = np.random.default_rng(1).standard_normal((3, 2, 5, 5))
    dy = np.random.default_rng(2).standard_normal((3, 2))
    y = whole.forward(x, training=True)
    whole.backward(dy)
    head, tail = parts.layers[:4], parts.layers[4:]
    h = fusion.forward_steps(head, x, True)
    np.testing.assert_array_equal(fusion.forward_steps(tail, h, True), y)
    assert parts.layers[2]._passed
    fusion.backward_steps(head, fusion.backward_steps(tail, dy))
    np.testing.assert_array_equal(parts.gradients_flat(), whole.gradients_flat())
