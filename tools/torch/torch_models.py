"""The pstrain model zoo in PyTorch: the same architectures, stems and
parameter order as models/model.cc, for fixtures
(testdata/gen_layers_fixture.py, testdata/gen_bert_fixture.py) and the
--compare_pytorch baseline of train_bench (tools/torch/torch_bench.py).

At 3x224x224 with 1000 classes the ResNets, AlexNet and VGG-16 are
torchvision's (same parameter counts); smaller inputs get the stems
described in models/model.h.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, inp, planes, stride, bottleneck):
        super().__init__()
        self.bottleneck = bottleneck
        exp = 4 if bottleneck else 1
        if bottleneck:
            self.conv1 = nn.Conv2d(inp, planes, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(planes)
            self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(planes)
            self.conv3 = nn.Conv2d(planes, planes * exp, 1, bias=False)
            self.bn3 = nn.BatchNorm2d(planes * exp)
        else:
            self.conv1 = nn.Conv2d(inp, planes, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(planes)
            self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = None
        if stride != 1 or inp != planes * exp:
            self.downsample = nn.Sequential(
                nn.Conv2d(inp, planes * exp, 1, stride, bias=False),
                nn.BatchNorm2d(planes * exp))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        if self.bottleneck:
            out = F.relu(self.bn2(self.conv2(out)))
            out = self.bn3(self.conv3(out))
        else:
            out = self.bn2(self.conv2(out))
        sc = x if self.downsample is None else self.downsample(x)
        return F.relu(out + sc)


class ResNet(nn.Module):
    def __init__(self, c, size, blocks, bottleneck, k):
        super().__init__()
        if size > 64:
            self.conv1 = nn.Conv2d(c, 64, 7, 2, 3, bias=False)
        else:
            self.conv1 = nn.Conv2d(c, 64, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.pool = size > 32
        layers = []
        inp = 64
        exp = 4 if bottleneck else 1
        for s, (planes, n) in enumerate(zip([64, 128, 256, 512], blocks)):
            stage = []
            for i in range(n):
                stride = 2 if (i == 0 and s > 0) else 1
                stage.append(Block(inp, planes, stride, bottleneck))
                inp = planes * exp
            layers.append(nn.Sequential(*stage))
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.fc = nn.Linear(inp, k)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        if self.pool:
            x = F.max_pool2d(x, 3, 2, 1)
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def alexnet(c, size, k):
    big = size > 64
    pool = (lambda: nn.MaxPool2d(3, 2)) if big else (lambda: nn.MaxPool2d(2, 2))
    feats = nn.Sequential(
        nn.Conv2d(c, 64, 11, 4, 2) if big else nn.Conv2d(c, 64, 3, 1, 1),
        nn.ReLU(), pool(), nn.Conv2d(64, 192, 5, padding=2), nn.ReLU(), pool(),
        nn.Conv2d(192, 384, 3, padding=1), nn.ReLU(),
        nn.Conv2d(384, 256, 3, padding=1), nn.ReLU(),
        nn.Conv2d(256, 256, 3, padding=1), nn.ReLU(), pool())
    flat = feats(torch.zeros(1, c, size, size)).numel()
    return nn.Sequential(feats, nn.Flatten(), nn.Dropout(), nn.Linear(flat, 4096),
                         nn.ReLU(), nn.Dropout(), nn.Linear(4096, 4096), nn.ReLU(),
                         nn.Linear(4096, k))


def vgg16(c, size, k):
    cfg = [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M",
           512, 512, 512, "M"]
    layers, inp, s = [], c, size
    for v in cfg:
        if v == "M":
            if s >= 2:
                layers.append(nn.MaxPool2d(2, 2))
                s //= 2
        else:
            layers += [nn.Conv2d(inp, v, 3, padding=1), nn.ReLU()]
            inp = v
    flat = 512 * s * s
    return nn.Sequential(*layers, nn.Flatten(), nn.Linear(flat, 4096), nn.ReLU(),
                         nn.Dropout(), nn.Linear(4096, 4096), nn.ReLU(), nn.Dropout(),
                         nn.Linear(4096, k))


def build(name, c, size, k):
    if name == "resnet18":
        return ResNet(c, size, [2, 2, 2, 2], False, k)
    if name == "resnet34":
        return ResNet(c, size, [3, 4, 6, 3], False, k)
    if name == "resnet50":
        return ResNet(c, size, [3, 4, 6, 3], True, k)
    if name == "resnet101":
        return ResNet(c, size, [3, 4, 23, 3], True, k)
    if name == "alexnet":
        return alexnet(c, size, k)
    if name == "vgg16":
        return vgg16(c, size, k)
    raise ValueError(name)




class LeNet5(nn.Module):
    def __init__(self, c, size, k):
        super().__init__()
        self.conv1 = nn.Conv2d(c, 6, 5, padding=2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        s = (size // 2 - 4) // 2
        self.fc1 = nn.Linear(16 * s * s, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, k)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(x, 1)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


def mlp(c, size, k):
    return nn.Sequential(nn.Flatten(), nn.Linear(c * size * size, 256), nn.ReLU(),
                         nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, k))


class BertEmbeddings(nn.Module):
    """Token + position embedding (BERT's without token types), LayerNorm,
    dropout."""

    def __init__(self, vocab, hidden, dropout, max_positions=512):
        super().__init__()
        self.token = nn.Embedding(vocab, hidden)
        self.position = nn.Embedding(max_positions, hidden)
        self.norm = nn.LayerNorm(hidden)
        self.dropout = nn.Dropout(dropout)

    def forward(self, ids):
        positions = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0)
        return self.dropout(self.norm(self.token(ids) + self.position(positions)))


class TiedDecoder(nn.Module):
    """The MLM decoder's bias; its weight is the token embedding's."""

    def __init__(self, vocab):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(vocab))

    def forward(self, h, weight):
        return F.linear(h, weight, self.bias)


class UntiedDecoder(nn.Linear):
    """The "_untied" BERTs' MLM decoder: a Linear(hidden, vocab) of its own
    (head.decoder.weight [vocab, hidden], head.decoder.bias)."""

    def forward(self, h, weight):
        return super().forward(h)


class MlmHead(nn.Module):
    def __init__(self, vocab, hidden, untied=False):
        super().__init__()
        self.dense = nn.Linear(hidden, hidden)
        self.norm = nn.LayerNorm(hidden)
        self.decoder = (UntiedDecoder(hidden, vocab) if untied
                        else TiedDecoder(vocab))

    def forward(self, x, token_weight):
        return self.decoder(self.norm(F.gelu(self.dense(x))), token_weight)


class Bert(nn.Module):
    """models/model.h's sequence zoo: BERT (Devlin et al. 2019) without token
    types, pooler or next-sentence head; post-LN nn.TransformerEncoderLayer
    blocks with GELU; the MLM head tied to the token embedding. state_dict
    keys are pstrain's parameter names (one key for the tied weight, so a
    pstrain model.safetensors loads with strict=True). forward(ids [N, S]
    long, padding_mask [N, S] bool, True = padding) -> logits [N, S, vocab].
    Initialised as BERT: N(0, 0.02) weights, zero biases, LayerNorm 1 and 0.
    """

    def __init__(self, vocab, layers, hidden, heads, feedforward, dropout=0.1,
                 untied=False, sparse=False):
        super().__init__()
        self.embeddings = BertEmbeddings(vocab, hidden, dropout)
        # untied: the "_untied" zoo models (head.decoder.weight of its own);
        # sparse: the token embedding's gradient as a sparse tensor of the
        # batch's rows (nn.Embedding(sparse=True)), for torch.optim.SparseAdam.
        self.embeddings.token.sparse = sparse
        self.layers = nn.ModuleList([
            nn.TransformerEncoderLayer(hidden, heads, feedforward, dropout,
                                       activation="gelu", batch_first=True)
            for _ in range(layers)])
        self.head = MlmHead(vocab, hidden, untied)
        for name, p in self.named_parameters():
            with torch.no_grad():
                if name.endswith("bias"):
                    p.zero_()
                elif "norm" in name:
                    p.fill_(1.0)
                else:
                    p.normal_(0.0, 0.02)

    def forward(self, ids, padding_mask=None, positions=None):
        """positions: flat row indices n * S + s (long [P]) to run the head
        at (BERT's gather_indexes; pstrain's head.gather in training) ->
        logits [P, vocab]; None: every position."""
        x = self.embeddings(ids)
        for layer in self.layers:
            x = layer(x, src_key_padding_mask=padding_mask)
        if positions is not None:
            x = x.reshape(-1, x.shape[-1])[positions]
        return self.head(x, self.embeddings.token.weight)


BERT_CONFIGS = {
    # layers, hidden, heads, feed-forward
    "bert_tiny": (2, 128, 2, 512),
    "bert_base": (12, 768, 12, 3072),
}


def bert(name, vocab, dropout=0.1, sparse=False):
    """"bert_tiny", "bert_base", or either with "_untied" (its own MLM
    decoder weight); sparse: the token embedding's gradient sparse."""
    untied = name.endswith("_untied")
    layers, hidden, heads, feedforward = BERT_CONFIGS[
        name[:-len("_untied")] if untied else name]
    return Bert(vocab, layers, hidden, heads, feedforward, dropout, untied,
                sparse)


def build_any(name, c, size, k):
    """Image models take (channels, size, classes); the BERTs take k as the
    vocabulary (c and size unused)."""
    if name in BERT_CONFIGS or name.removesuffix("_untied") in BERT_CONFIGS:
        return bert(name, k)
    if name == "lenet5":
        return LeNet5(c, size, k)
    if name == "mlp":
        return mlp(c, size, k)
    return build(name, c, size, k)
