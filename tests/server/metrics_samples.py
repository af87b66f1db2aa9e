"""A /metrics text's samples, parsed with prometheus-client's own parser, and the sum of those of
one name whose labels hold the ones asked for."""
from prometheus_client.parser import text_string_to_metric_families


def samples(text):
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append(s)
    return out


def value(found, name, **labels):
    return sum(s.value for s in found.get(name, []) if all(s.labels.get(k) == v for k, v in labels.items()))
