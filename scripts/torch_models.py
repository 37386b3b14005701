"""Tessera's model registry (engine/models/registry.h) in PyTorch, layer for layer and with the same parameter names,
for scripts/torch_checkpoint.py (checkpoints to and from PyTorch) and scripts/bench_torch.py (PyTorch's speed).

torchvision's resnet18/34/50, vgg11/11_bn/16/16_bn and alexnet come from torchvision when it is installed (Debian's
python3-torchvision), else from the same definitions written out below; `compact`, `lenet5` and `tiny_cnn` are
Tessera's own (engine/models/compact.h, lenet.h, tiny_cnn) and always defined here.
"""
import torch
from torch import nn

try:
    import torchvision.models as tv_models
except ImportError:
    tv_models = None


# ---------------------------------------------------------------------------------------------------------------
# Tessera's own models.

class TinyCNN(nn.Module):
    def __init__(self, num_classes=2, channels=4):
        super().__init__()
        self.conv1 = nn.Conv2d(3, channels, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.relu = nn.ReLU(inplace=True)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(channels, num_classes)

    def forward(self, x):
        x = self.avgpool(self.relu(self.bn1(self.conv1(x))))
        return self.fc(torch.flatten(x, 1))


class CompactCNN(nn.Module):
    """engine/models/compact.h: five conv3x3-BN-ReLU stages (the first four max-pooled), global average pool,
    dropout, fc."""

    def __init__(self, num_classes=2, channels=3, width=32, dropout=0.5):
        super().__init__()
        layers = []
        inputs = channels
        for stage, factor in enumerate((1, 2, 4, 8, 8)):
            out = width * factor
            layers += [nn.Conv2d(inputs, out, 3, padding=1, bias=False), nn.BatchNorm2d(out), nn.ReLU(inplace=True)]
            if stage < 4:
                layers.append(nn.MaxPool2d(2))
            inputs = out
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.dropout = nn.Dropout(dropout)
        self.fc = nn.Linear(inputs, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x):
        x = torch.flatten(self.avgpool(self.features(x)), 1)
        return self.fc(self.dropout(x))


class LeNet5(nn.Module):
    """engine/models/lenet.h: ReLU and max-pooling; fc1 sized from the input."""

    def __init__(self, num_classes=2, channels=3, size=32):
        super().__init__()
        s = ((size - 4) // 2 - 4) // 2
        self.conv1 = nn.Conv2d(channels, 6, 5)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * s * s, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, num_classes)

    def forward(self, x):
        x = nn.functional.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = nn.functional.max_pool2d(torch.relu(self.conv2(x)), 2)
        x = torch.flatten(x, 1)
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))



# ---------------------------------------------------------------------------------------------------------------
# torchvision's models, for when torchvision is not installed (same modules, same parameters).

class BasicBlock(nn.Module):
    def __init__(self, inplanes, planes, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, kernel_size=3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes, kernel_size=1, stride=stride, bias=False),
                                            nn.BatchNorm2d(planes))

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes, planes, stride):
        super().__init__()
        out = planes * self.expansion
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or inplanes != out:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, out, 1, stride=stride, bias=False), nn.BatchNorm2d(out))

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        return self.relu(self.bn3(self.conv3(out)) + identity)


class ResNet(nn.Module):
    def __init__(self, block, blocks, num_classes):
        super().__init__()
        expansion = getattr(block, "expansion", 1)
        self.conv1 = nn.Conv2d(3, 64, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        inplanes = 64
        for index, (planes, count) in enumerate(zip((64, 128, 256, 512), blocks)):
            stride = 1 if index == 0 else 2
            layers = [block(inplanes, planes, stride)]
            inplanes = planes * expansion
            layers += [block(inplanes, planes, 1) for _ in range(count - 1)]
            setattr(self, "layer%d" % (index + 1), nn.Sequential(*layers))
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * expansion, num_classes)
        for m in self.modules():  # torchvision's initialisation
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


VGG_CONFIGS = {
    "vgg11": [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
    "vgg16": [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"],
}


class VGG(nn.Module):
    def __init__(self, config, batch_norm, num_classes, width=4096, dropout=0.5):
        super().__init__()
        layers = []
        inputs = 3
        for v in config:
            if v == "M":
                layers.append(nn.MaxPool2d(2, 2))
                continue
            layers.append(nn.Conv2d(inputs, v, 3, padding=1))
            if batch_norm:
                layers.append(nn.BatchNorm2d(v))
            layers.append(nn.ReLU(inplace=True))
            inputs = v
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
        self.classifier = nn.Sequential(nn.Linear(512 * 7 * 7, width), nn.ReLU(True), nn.Dropout(dropout),
                                        nn.Linear(width, width), nn.ReLU(True), nn.Dropout(dropout),
                                        nn.Linear(width, num_classes))
        for m in self.modules():  # torchvision's initialisation (engine/models/vgg.cpp's too)
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0.0, 0.01)
                nn.init.zeros_(m.bias)

    def forward(self, x):
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


class AlexNet(nn.Module):
    def __init__(self, num_classes, width=4096, dropout=0.5):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 64, 11, stride=4, padding=2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2),
            nn.Conv2d(64, 192, 5, padding=2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2),
            nn.Conv2d(192, 384, 3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(384, 256, 3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(256, 256, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2))
        self.avgpool = nn.AdaptiveAvgPool2d((6, 6))
        self.classifier = nn.Sequential(nn.Dropout(dropout), nn.Linear(256 * 6 * 6, width), nn.ReLU(inplace=True),
                                        nn.Dropout(dropout), nn.Linear(width, width), nn.ReLU(inplace=True),
                                        nn.Linear(width, num_classes))

    def forward(self, x):
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


RESNETS = {"resnet18": (BasicBlock, (2, 2, 2, 2)), "resnet34": (BasicBlock, (3, 4, 6, 3)),
           "resnet50": (Bottleneck, (3, 4, 6, 3))}
TORCHVISION = ("resnet18", "resnet34", "resnet50", "vgg11", "vgg11_bn", "vgg16", "vgg16_bn", "alexnet")



# The input size each architecture's checkpoints record when none is given (engine/models/registry.cpp's defaults).
DEFAULT_INPUT_SIZE = {"tiny_cnn": 8, "lenet5": 32, "compact": 96, "alexnet": 224, "vgg11": 224, "vgg11_bn": 224,
                      "vgg16": 224, "vgg16_bn": 224, "resnet18": 224, "resnet34": 224, "resnet50": 224}
ARCHITECTURES = tuple(DEFAULT_INPUT_SIZE)

# The size an architecture is built with (engine/models/registry.h ModelSize; the job keys model.width and
# model.classifier_width, the checkpoint's /meta attributes width and classifier_width) and its default.
SIZE_KEY = {"compact": "width", "alexnet": "classifier_width", "vgg11": "classifier_width",
            "vgg11_bn": "classifier_width", "vgg16": "classifier_width", "vgg16_bn": "classifier_width"}
DEFAULT_SIZE = {"width": 32, "classifier_width": 4096}


def given_sizes(name, width=None, classifier_width=None):
    """{key: value} of the sizes given (not None). A size the architecture is not built with stops the script unless it
    is at its default, as `tessera train`'s model.width and model.classifier_width."""
    given = {key: value for key, value in (("width", width), ("classifier_width", classifier_width))
             if value is not None}
    for key, value in given.items():
        if SIZE_KEY.get(name) != key and value != DEFAULT_SIZE[key]:
            raise SystemExit("%s is not built with a %s (%s only)"
                             % (name, key, ", ".join(a for a, k in SIZE_KEY.items() if k == key)))
    return given


def build_model(name, num_classes, size=None, width=None, classifier_width=None):
    """The model and where its definition came from ("torchvision" or "torch_models.py"). `width` (compact) and
    `classifier_width` (alexnet, vgg*) are the sizes of engine/models/model.h's ModelOptions; None is the default, and a
    size the architecture is not built with stops the script. torchvision's AlexNet and VGG have no classifier width:
    another than 4096 takes the same definitions written out below."""
    given = {key: value for key, value in given_sizes(name, width, classifier_width).items()
             if value != DEFAULT_SIZE[key]}
    hidden = given.get("classifier_width", DEFAULT_SIZE["classifier_width"])
    if name == "compact":
        return CompactCNN(num_classes, width=given.get("width", DEFAULT_SIZE["width"])), "torch_models.py"
    if name == "lenet5":
        return LeNet5(num_classes, size=size or DEFAULT_INPUT_SIZE["lenet5"]), "torch_models.py"
    if name == "tiny_cnn":
        return TinyCNN(num_classes), "torch_models.py"
    if name not in TORCHVISION:
        raise SystemExit("unknown model '%s' (known: compact, lenet5, tiny_cnn, %s)"
                         % (name, ", ".join(TORCHVISION)))
    if tv_models is not None and not given:
        return getattr(tv_models, name)(num_classes=num_classes), "torchvision"
    if name in RESNETS:
        block, blocks = RESNETS[name]
        return ResNet(block, blocks, num_classes), "torch_models.py"
    if name == "alexnet":
        return AlexNet(num_classes, width=hidden), "torch_models.py"
    base = name.replace("_bn", "")
    return VGG(VGG_CONFIGS[base], name.endswith("_bn"), num_classes, width=hidden), "torch_models.py"


def model_size(name, state):
    """{"width": w} or {"classifier_width": w} of a state_dict of `name`, read from its tensors' shapes (compact: the
    first convolution's output channels; alexnet, vgg*: the first linear layer's outputs), or {} for an architecture
    without a size or a state_dict without those tensors."""
    key = SIZE_KEY.get(name)
    if key == "width" and "features.0.weight" in state:
        return {key: int(state["features.0.weight"].shape[0])}
    if key == "classifier_width":
        linear = sorted((int(k.split(".")[1]), k) for k, v in state.items()
                        if k.startswith("classifier.") and k.endswith(".weight") and v.dim() == 2)
        if linear:
            return {key: int(state[linear[0][1]].shape[0])}
    return {}


def classifier_weight(model):
    """The name of the last linear layer's weight: the classifier head (its rows are the classes)."""
    last = [name for name, m in model.named_modules() if isinstance(m, nn.Linear)][-1]
    return last + ".weight"
