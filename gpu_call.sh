source .gpu/activate
mkdir -p $OUT/r
LIMIT=300 bash benchmarks/run_gpu_checks.sh $OUT/r nn > $OUT/r/checks_stdout.txt 2>&1
tail -3 $OUT/r/nn.log
grep -E "^(FAILED|ERROR)|SKIPPED" $OUT/r/nn.log
python3 benchmarks/probes/dropin_packed_timeline.py --batch 64 --calls 50 > $OUT/r/timeline_b64.txt 2>&1
grep -A8 "the last call's work" $OUT/r/timeline_b64.txt
timeout 200 python3 benchmarks/dropin_vs_torch.py --cases 0,1,5,6,7 --repeats 10 --out $OUT/r/dropin.json > $OUT/r/dropin.txt 2>&1
tail -7 $OUT/r/dropin.txt
cd $OUT && tar czf r.tar.gz r
