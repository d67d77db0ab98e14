"""ResNet-18 written in plain PyTorch (torchvision's architecture: 7x7/2 stem, 3x3/2 max
pool, four stages of two basic blocks, global average pool, linear head), for the
import tests; torchvision itself does not import with the CPU torch here. Also a model
file: ``--model tests/models/torch_resnet18.py`` builds it for a dataset."""
import torch
from torch import nn


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU()
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                            nn.BatchNorm2d(cout))

    def forward(self, x):
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return self.relu(y + (x if self.downsample is None else self.downsample(x)))


class ResNet18(nn.Module):
    def __init__(self, num_classes: int = 1000, width: int = 64):
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU()
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        stages, cin = [], width
        for i, cout in enumerate((width, 2 * width, 4 * width, 8 * width)):
            stride = 1 if i == 0 else 2
            stages.append(nn.Sequential(BasicBlock(cin, cout, stride),
                                        BasicBlock(cout, cout, 1)))
            cin = cout
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def randomize_statistics(model: nn.Module, seed: int = 0) -> nn.Module:
    """Batch norms away from their initial 0/1 statistics (as a trained net's)."""
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            c = m.num_features
            m.running_mean.copy_(0.2 * torch.randn(c, generator=g))
            m.running_var.copy_(0.5 + torch.rand(c, generator=g))
            m.weight.data.copy_(0.5 + torch.rand(c, generator=g))
            m.bias.data.copy_(0.2 * torch.randn(c, generator=g))
    return model


def export(model: nn.Module, path, input_shape=(3, 32, 32), training: bool = False,
           dynamo: bool = False) -> str:
    """``torch.onnx.export``: the TorchScript exporter (offline, no onnxscript), where eval
    mode folds each batch norm into its convolution and ``training=True`` keeps them; or
    ``dynamo=True``, torch's default exporter (needs onnxscript; eval mode)."""
    import warnings
    if dynamo:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(model.eval(), (torch.zeros(2, *input_shape),), str(path),
                              input_names=["input"], verbose=False,
                              dynamic_shapes={"x": {0: torch.export.Dim("batch")}})
        return str(path)
    mode = torch.onnx.TrainingMode.TRAINING if training else torch.onnx.TrainingMode.EVAL
    model.train(training)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (torch.zeros(2, *input_shape),), str(path), dynamo=False,
                          opset_version=17, input_names=["input"], output_names=["output"],
                          dynamic_axes={"input": {0: "batch"}, "output": {0: "batch"}},
                          training=mode)
    model.eval()
    return str(path)


def build_model(num_classes: int = 10, seed: int = 0):
    torch.manual_seed(seed)
    return ResNet18(num_classes)
