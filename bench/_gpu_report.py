"""bench/gpu_steps.py's report: the BENCHMARKS.md section rendered from its results JSON."""
from __future__ import annotations

import numpy as np

SECTION = "## GPU: CUDA training steps, embedding and search (bench/gpu_steps.py)"


# ---- report --------------------------------------------------------------------------------------
def render(res: dict) -> str:
    L = [SECTION, "", f"Machine: {res['machine']}. Date: {res['date']}. Command: `{res['command']}`.", ""]
    tr = [r for r in res.get("train", []) if "cuda_fp32" in r]
    if tr:
        L += ["### Training steps (the loop's `train_step`, synthetic scenes, fresh model per column)", "",
              "| recipe | batch | CPU fp32 ms/step | CUDA fp32 | CUDA fp16 AMP | CUDA bf16 AMP | best CUDA vs CPU | "
              "loss gap, step 1: fp32 / fp16 / bf16 | mean gap: fp32 / fp16 / bf16 |",
              "|---|---:|---:|---:|---:|---:|---:|---|---|"]
        for r in tr:
            cols = [k for k in ("cuda_fp32", "cuda_fp16", "cuda_bf16") if k in r]
            c = r["cpu_fp32"]["ms_per_step"]
            ref = r["cpu_fp32"]["losses"]
            ms = {k: r[k]["ms_per_step"] for k in cols}
            first = " / ".join(f"{r[k]['losses'][0] - ref[0]:+.1e}" for k in cols)
            mean = " / ".join(f"{float(np.mean(np.subtract(r[k]['losses'][:len(ref)], ref))):+.1e}" for k in cols)
            cells = " | ".join(f"{ms[k]:.1f}" if k in ms else "–" for k in ("cuda_fp32", "cuda_fp16", "cuda_bf16"))
            L.append(f"| `{r['recipe']}` | {r['batch_size']} | {c:.0f} | {cells} | {c / min(ms.values()):.1f}× | "
                     f"{first} | {mean} |")
        L += ["", f"CPU: {tr[0]['cpu_fp32']['steps']} steps, CUDA: {tr[0]['cuda_fp32']['steps']} steps "
              "(each after an untimed pass of the same steps). Loss gaps: CUDA minus the CPU's fp32 loss on the same "
              "batches from the same initial model, over the CPU's steps.", ""]
    if isinstance(res.get("profile"), str):
        L += ["### Where a cached-feature CUDA step's time goes (`flickr8k_ltd`, fp32, torch.profiler)", "",
              "```", res["profile"].rstrip(), "```", ""]
    if res.get("caption"):
        L += ["### Captioner steps (`caption_synthetic_sr_pl`, bench/caption_epoch.py's loop; judge: the whole run's model)",
              "", "| device | XE s/step | SCST s/step | beam-5 captions/s | val s |", "|---|---:|---:|---:|---:|"]
        for dev, c in res["caption"].items():
            if isinstance(c, dict) and "xe_step_s" in c:
                L.append(f"| {dev} | {c['xe_step_s']:.4f} | {c['scst_step_s']:.4f} | {c['beam5_captions_per_s']:.0f} | "
                         f"{c['val_s']:.1f} |")
        L.append("")
    for r in res.get("train", []):
        if "error" in r:
            L += [f"- `{r['recipe']}` failed: `{r['error']}`"]
    w = res.get("whole_run")
    if isinstance(w, dict) and "two_epochs_s" in w:
        L += ["### A whole CUDA run, resumed, then served from the CPU", "",
              f"`training.loop.train` on `synthetic_ltd` (fp16 AMP): 2 epochs in {w['two_epochs_s']:.1f} s, resumed to "
              f"3 in {w['resume_to_3_s']:.1f} s (epochs logged: {w['epochs_logged']}); every step's loss finite: "
              f"{w['finite_losses']}; λ at the end {w['last_lambda']}. The checkpoint rebuilt on the CPU embeds captions "
              f"as the CUDA model does (minimum cosine {w['cpu_vs_cuda_caption_cosine_min']:.7f}); `best.pt` loads on "
              f"the CPU: {w['best_pt_loads_on_cpu']}.", ""]
    thr = [(k, t) for k, t in [("images", "EfficientNet-Lite0 (packaged weights), images/s, CNN only; CPU batch 32, GPU 256"),
                               ("minilm", "all-MiniLM-L6-v2 architecture (random weights), captions/s, batch 256"),
                               ("mpnet", "all-mpnet-base-v2 architecture (random weights), captions/s, batch 256")]
           if isinstance(res.get(k), dict) and "cpu_fp32" in res[k]]
    if thr:
        L += ["### Embedding throughput", "", "| model | CPU fp32 | GPU fp32 | GPU fp16 | GPU fp16 vs CPU | "
              "fp16 vs fp32 cosine (min) |", "|---|---:|---:|---:|---:|---:|"]
        for k, title in thr:
            e = res[k]
            cos = f"{e['fp16_cosine_min']:.4f}" if "fp16_cosine_min" in e else "–"
            L.append(f"| {title} | {e['cpu_fp32']:,.0f} | {e['cuda_fp32']:,.0f} | {e['cuda_fp16']:,.0f} | "
                     f"{e['cuda_fp16'] / e['cpu_fp32']:.0f}× | {cos} |")
        L.append("")
    sr = res.get("search")
    if isinstance(sr, dict) and "faiss_cpu_qps" in sr:
        L += [f"### Exact top-{sr['k']} search: {sr['queries']:,} queries against {sr['n']:,} × {sr['d']} vectors", "",
              f"| faiss-cpu IndexFlatIP ({sr['cpu_threads']} threads) | GPU matmul + top-k fp32 | GPU fp16 | "
              f"fp16 top-{sr['k']} overlap with exact |", "|---:|---:|---:|---:|",
              f"| {sr['faiss_cpu_qps']:,.0f} q/s | {sr['cuda_fp32_qps']:,.0f} q/s | {sr['cuda_fp16_qps']:,.0f} q/s | "
              f"{sr['cuda_fp16_top10_overlap']:.4f} |", "", f"({sr['transfer_note']}.)", ""]
    for e in res.get("errors", []):
        L.append(f"- error: `{e}`")
    if res.get("notes"):
        L += ["### Reading", "", *res["notes"]]
    return "\n".join(L).rstrip() + "\n"
