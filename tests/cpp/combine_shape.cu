// Host driver for tests/test_schedule.py (the combine's tests): runs attncc/core/combine.cuh's CombineShape::part_tasks
// (what the combine kernel and its launch both compute) on cases read from stdin, one per line,
//     d_v num_seqs seq_rows wave
// (the value's width; sequences; rows a sequence; blocks the GPU holds at once), and prints
//     task rows blocks       task: slab, pair or row; a block's rows; the grid's blocks
#include <iostream>
#include <sstream>
#include <string>

#include "attncc/core/combine.cuh"

namespace {
template <int kDV_>
struct Value {  // what CombineShape reads of a plan's config
  static constexpr int kDV = kDV_;
};

template <int kDV>
void run(int num_seqs, int seq_rows, long long wave) {
  using S = attncc::CombineShape<Value<kDV>>;
  const auto pt = S::part_tasks(num_seqs, seq_rows, wave);
  const char* task = pt.task == attncc::MergeTask::kSlab ? "slab" : pt.task == attncc::MergeTask::kPair ? "pair" : "row";
  std::cout << task << ' ' << pt.rows << ' ' << S::part_blocks(num_seqs, seq_rows, pt.rows) << '\n';
}
}  // namespace

int main() {
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    int d_v, num_seqs, seq_rows;
    long long wave;
    if (!(in >> d_v >> num_seqs >> seq_rows >> wave)) continue;
    switch (d_v) {
      case 128: run<128>(num_seqs, seq_rows, wave); break;
      case 256: run<256>(num_seqs, seq_rows, wave); break;
      case 384: run<384>(num_seqs, seq_rows, wave); break;
      case 512: run<512>(num_seqs, seq_rows, wave); break;
      default: std::cout << "? d_v " << d_v << '\n';
    }
  }
  return 0;
}
