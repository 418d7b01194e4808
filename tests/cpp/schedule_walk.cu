// Host driver for tests/test_schedule.py: runs attncc/core/schedule.cuh's balanced schedule on
// cases read from stdin ("P[:S[:C]] n_0 n_1 ..." per line: parts, whole_parts_fit's slack in tiles
// (S, default -1: none), a piece's cost in tiles (C, default 0), then each sequence's tile count) and
// prints what the decode kernel's walk and the combine's lookup would do:
//     M whole|cut possible                    whether the parts hold whole sequences, and whether
//                                             whole_parts_possible lets them (0 / 1)
//     Q whole|cut                             equal sequences: what equal_whole_parts says
//     W part seq tile_begin tile_end slot     one line per piece, parts in order
//     C seq slot...                           the partial slots the combine merges ("C seq -":
//                                             none, the kernel wrote the sequence directly)
//     E                                       end of a case
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "attncc/core/schedule.cuh"

int main() {
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string head;
    if (!(in >> head)) continue;
    std::vector<int> head_fields;
    for (std::size_t at = 0; at != std::string::npos;) {
      const auto colon = head.find(':', at);
      head_fields.push_back(std::stoi(head.substr(at, colon == std::string::npos ? colon : colon - at)));
      at = colon == std::string::npos ? colon : colon + 1;
    }
    const int parts = head_fields[0];
    const int slack = head_fields.size() > 1 ? head_fields[1] : -1;
    const int cost = head_fields.size() > 2 ? head_fields[2] : 0;
    std::vector<int> n;
    for (int x; in >> x;) n.push_back(x);
    const int num_seqs = static_cast<int>(n.size());
    auto tiles = [&](int s) { return attncc::line_length(n[s], cost); };  // the line's lengths
    long long total = 0;
    for (int s = 0; s < num_seqs; ++s) total += tiles(s);

    // the parts' bounds: part_begin, or whole-sequence parts' begin' where the launch takes them
    const bool whole = attncc::whole_parts_sequential(tiles, num_seqs, total, parts, slack);
    auto begin = [&](int p) {
      return whole ? attncc::whole_begin_sequential(tiles, num_seqs, total, parts, p) : attncc::part_begin(p, total, parts);
    };
    std::cout << "M " << (whole ? "whole" : "cut") << ' ' << attncc::whole_parts_possible(num_seqs, parts) << '\n';
    bool equal = true;
    for (int x : n) equal = equal && x == n[0];
    if (equal && num_seqs > 0)
      std::cout << "Q " << (attncc::equal_whole_parts(num_seqs, static_cast<int>(tiles(0)), parts, slack) ? "whole" : "cut") << '\n';
    for (int p = 0; p < parts; ++p) {
      long long first_base = 0;
      const int first = attncc::first_seq_sequential(tiles, num_seqs, begin(p), &first_base);
      for (auto w = attncc::PartWalk::start(p, parts, num_seqs, total, begin(p), begin(p + 1), first, first_base);
           w.seq < num_seqs && w.has_piece(n[w.seq], cost); w.next(n[w.seq], cost)) {
        const attncc::Piece pc = w.piece(n[w.seq], cost);
        std::cout << "W " << p << ' ' << pc.seq << ' ' << pc.tile_begin << ' ' << pc.tile_end << ' ' << pc.slot << '\n';
      }
    }
    long long base = 0;
    for (int s = 0; s < num_seqs; ++s) {
      const auto sp = attncc::SeqPieces::of(base, n[s], total, parts, cost);
      std::cout << "C " << s;
      if (whole || sp.whole()) {
        std::cout << " -";
      } else {
        for (int p = sp.first; p <= sp.last; ++p)
          if (sp.slot(p) >= 0) std::cout << ' ' << sp.slot(p);
      }
      std::cout << '\n';
      base += tiles(s);
    }
    std::cout << "E\n";
  }
  return 0;
}
