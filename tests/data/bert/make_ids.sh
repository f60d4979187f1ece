#!/bin/sh
# The token ids numpy_golden.py takes: osprey's tokenizer on the texts test_bert.c and make_golden.py use, and for
# the cross-encoder each (query, document) pair as <s> query </s></s> document </s>. Then the numpy goldens.
#   sh tests/data/bert/make_ids.sh build/osprey
set -e
OSP=${1:-build/osprey}
D=tests/data/bert
tok() { "$OSP" tokenize --model "$1" --text "$2" $3; }
for m in bert-tiny xlmr-tiny; do
  {
    echo "["
    tok $D/$m "The cat sat on the mat." --add-special; echo ","
    tok $D/$m "hi" --add-special; echo ","
    tok $D/$m "Ｈello, wörld! 中国 running ﬁ cats" --add-special; echo ","
    tok $D/$m "the the the the the the the the the the cat" --add-special
    echo "]"
  } > /tmp/osp_bert_ids_$m.json
  /usr/bin/python3 $D/numpy_golden.py $D/$m $D/$m/numpy_golden.safetensors /tmp/osp_bert_ids_$m.json
done
pair() { printf '[0, %s, 2, 2, %s, 2]' "$(tok $D/xlmr-reranker-tiny "$1" | tr -d '[]')" "$(tok $D/xlmr-reranker-tiny "$2" | tr -d '[]')"; }
{
  echo "["
  pair "what sat on the mat?" "The cat sat on the mat."; echo ","
  pair "hi" "hello"; echo ","
  pair "where is the cat" "running cats sat in the hall"; echo ","
  pair "the" "the the the the the the the the"
  echo "]"
} > /tmp/osp_bert_ids_pairs.json
/usr/bin/python3 $D/numpy_golden.py $D/xlmr-reranker-tiny $D/xlmr-reranker-tiny/numpy_golden.safetensors /tmp/osp_bert_ids_pairs.json
