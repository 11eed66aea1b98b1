"""One cell of a pretrained model's results.json (``posexp eval hf:MODEL``) reproduced with transformers alone.

    python scripts/reproduce_cell.py RUN

``run.text`` names the scored text (the validation ``documents`` under ``root`` of a ``by_file`` split, each tokenized
without special tokens, joined by ``separator``); each window's first input is ``bos`` unless it is null
(``hf.bos=auto``: as the tokenizer adds one by default); a row's ``targets`` are the first and last token scored.
It prints the first row's perplexity (nonoverlap protocol) beside the one results.json recorded.
"""
import argparse
import json
import math
import pathlib

import torch
import transformers as T


def main(run_dir: str) -> None:
    res = json.loads(pathlib.Path(run_dir, "results.json").read_text())
    run, row = res["run"], res["rows"][0]
    name, text, (first, last), L, nll = run["pretrained"]["name"], run["text"], row["targets"], row["length"], 0.0
    model, tok = T.AutoModelForCausalLM.from_pretrained(name).eval(), T.AutoTokenizer.from_pretrained(name)
    docs = [tok(pathlib.Path(text["root"], d).read_bytes().decode(), add_special_tokens=False)["input_ids"]
            for d in text["documents"]]
    ids = sum(([text["separator"]] + d for d in docs), [])[1:]  # the documents joined by the separator
    for s in range(first - 1, last, L):  # nonoverlap: window s .. s+L-1 predicts targets s+1 .. s+L
        x = torch.tensor([ids[s:s + L + 1]])
        if text["bos"] is not None:
            x[0, 0] = text["bos"]
        with torch.no_grad():
            nll += torch.nn.functional.cross_entropy(model(x[:, :-1]).logits[0], x[0, 1:], reduction="sum").item()
    print(f"ppl at {L}: {math.exp(nll / (last - first + 1)):.6f}, results.json: {row['ppl']:.6f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", help="the run folder of posexp eval hf:MODEL (its results.json)")
    main(parser.parse_args().run)
