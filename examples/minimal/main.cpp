// Ulysses attention on every rank of MPI_COMM_WORLD, checked against the float64 reference.
//   mpirun -n 2 ./minimal
#include <ulysses/comm/mpi_communicator.hpp>
#include <ulysses/ulysses.hpp>

#include <cstdio>

int main(int argc, char** argv) {
  const ulysses::MpiSession mpi(argc, argv);
  int code = 0;
  {
    ulysses::MpiCommunicator comm(MPI_COMM_WORLD);
    const int cp = comm.size();
    const std::int64_t batch = 1, seq = 64 * cp, heads = 2 * cp, head_dim = 32, local = seq / cp;
    // Each rank holds tokens [rank·s/cp, (rank+1)·s/cp) of q, k, v: [b, s/cp, h, d].
    ulysses::Tensor q({batch, local, heads, head_dim}), k(q.shape()), v(q.shape()), out(q.shape());
    for (auto [t, seed] : {std::pair{&q, 1}, {&k, 2}, {&v, 3}})
      ulysses::fill_uniform(t->view(), seed, comm.rank() * local);

    ulysses::ContextParallelAttention attention(comm, {.cp_comm_type = "a2a", .causal = true});
    const ulysses::CpContext ctx = attention.forward(out.view(), q.view(), k.view(), v.view());

    // The reference over the whole sequence, compared on this rank's slice.
    ulysses::Tensor gq({batch, seq, heads, head_dim}), gk(gq.shape()), gv(gq.shape());
    for (auto [t, seed] : {std::pair{&gq, 1}, {&gk, 2}, {&gv, 3}}) ulysses::fill_uniform(t->view(), seed);
    ulysses::RefTensor ref_out;
    std::vector<double> lse;
    ulysses::reference_attention_forward(ref_out, lse, ulysses::RefTensor::from(gq.view()),
                                         ulysses::RefTensor::from(gk.view()), ulysses::RefTensor::from(gv.view()),
                                         {.causal = true});
    ulysses::RefTensor mine({batch, local, heads, head_dim});
    for (std::int64_t s = 0; s < local; ++s)
      for (std::int64_t h = 0; h < heads; ++h)
        for (std::int64_t d = 0; d < head_dim; ++d) mine.at(0, s, h, d) = ref_out.at(0, comm.rank() * local + s, h, d);
    const double err = ulysses::relative_error(out.view(), mine);
    std::printf("rank %d/%d: relative error vs float64 reference %.2e\n", comm.rank(), cp, err);
    code = err < 1e-5 ? 0 : 1;
  }
  return code;
}
